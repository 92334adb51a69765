"""A stale backend.json proves nothing: after a crash its pid may belong to another process and its port to
another user. No token goes to a listener before it proves it is the backend the file names, no pid is
signalled unless it is that backend, a slow backend is waited for, and a state dir others can write to is
refused. Real processes throughout: a real local backend, an impostor listener run as a second uid
(setpriv), an unrelated process holding the pid, the Jupyter proxy's own request path."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cortex_nb import Client
from cortex_nb.errors import CortexError
from cortex_nb.local import ensure_local_backend, find_local_backend, process_exited, wait_for_exit
from cortex_nb.protocol.versions import API_VERSION, __version__

from .impostor import attacker_folder, received, start_impostor, stop
from .unprivileged import UNPRIVILEGED_UID, unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")


@pytest.fixture
def attacker_dir():
    with attacker_folder() as path:
        yield path


def crash(backend) -> None:
    """The backend dies without cleaning up: its backend.json stays, naming its pid and port."""
    os.killpg(backend.pid, signal.SIGKILL)
    assert wait_for_exit(backend.pid, 30)


def point_state_at(local: Path, pid: int) -> dict:
    """What pid reuse does to a stale state file: its pid is now another process's."""
    state = json.loads((local / "backend.json").read_text())
    state["pid"] = pid
    (local / "backend.json").write_text(json.dumps(state))
    return state


def start(local: Path):
    return ensure_local_backend(local, devices="cpu", warm_workers=0, start_timeout_s=180)


def test_an_impostor_of_another_uid_on_the_stale_port_never_gets_the_token(tmp_path, attacker_dir):
    local = tmp_path / "local"
    first = start(local)
    port = int(first.url.rsplit(":", 1)[1])
    crash(first)
    impostor, log = start_impostor(attacker_dir, port)
    second = None
    try:
        # After the crash the old pid went to the impostor's process, the old port too.
        point_state_at(local, impostor.pid)
        with Client.local(local, devices="cpu", warm_workers=0) as client:
            second = client.local_backend
            assert client.whoami()["owner"]
        assert received(log) == "", "the impostor received the token"
        assert second.url != first.url and second.started

        # The Jupyter server's local mode: its request path never aims the token at the impostor either.
        point_state_at(local, impostor.pid)
        from cortex_server.backend import BackendConnection
        from cortex_server.discovery import LocalBackend

        connection = BackendConnection(LocalBackend(local), connect_timeout_s=5, request_timeout_s=10)
        try:
            target = connection.target()
            assert target.url is None and "no local backend is running" in target.description
            with pytest.raises(CortexError) as refused:
                connection.build_request("GET", "/v1/whoami")
            assert refused.value.code == "backend_unavailable"
        finally:
            connection.close()
        assert received(log) == ""
    finally:
        stop(impostor)
        if second is not None and second.pid != impostor.pid:
            second.stop()


def test_the_jupyter_proxy_forwards_to_its_proven_local_backend(tmp_path):
    """The proof is made once and the proxy's request reaches the real backend with the token."""
    local = tmp_path / "local"
    backend = start(local)
    try:
        from cortex_server.backend import BackendConnection
        from cortex_server.discovery import LocalBackend

        async def whoami() -> tuple[int, object]:
            connection = BackendConnection(LocalBackend(local), connect_timeout_s=5, request_timeout_s=30)
            try:
                return await connection.get_json(connection.target(), "/v1/whoami")
            finally:
                connection.close()

        status, body = asyncio.run(whoami())
        assert status == 200 and body["owner"]
    finally:
        backend.stop()


def test_an_unrelated_process_holding_the_stale_pid_is_never_signalled(tmp_path):
    local = tmp_path / "local"
    first = start(local)
    crash(first)
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    second = None
    try:
        point_state_at(local, bystander.pid)
        second = start(local)  # the stale state: a new backend starts, the bystander is left alone
        assert second.started and second.pid not in (first.pid, bystander.pid)
        stale = first
        stale.pid = bystander.pid
        stale.stop(timeout_s=1)  # a stop through the stale endpoint does nothing to it either
        time.sleep(0.3)
        assert bystander.poll() is None, "the process holding the old pid was signalled"
    finally:
        stop(bystander)
        if second is not None:
            second.stop()


def test_a_slow_local_backend_is_waited_for_not_killed(tmp_path):
    local = tmp_path / "local"
    backend = start(local)
    try:
        # It does not answer for 5 s (as under a crowd of clients): longer than a probe waits.
        os.kill(backend.pid, signal.SIGSTOP)
        threading.Timer(5.0, os.kill, (backend.pid, signal.SIGCONT)).start()
        found = ensure_local_backend(local, devices="cpu", warm_workers=0, start_timeout_s=60)
        assert found.pid == backend.pid and not found.started
        assert not process_exited(backend.pid)
        assert find_local_backend(local) is not None
    finally:
        os.kill(backend.pid, signal.SIGCONT)
        backend.stop()


def test_a_state_dir_others_can_write_to_is_refused_before_any_token_is_sent(tmp_path, attacker_dir):
    # The victim's other token, which a planted state file names.
    secret = tmp_path / "other.token"
    secret.write_text("victims-other-secret-token\n")
    impostor, log = start_impostor(attacker_dir, 0)
    try:
        port = int((attacker_dir / "port.txt").read_text())
        shared = attacker_dir / "shared-local"
        shared.mkdir()
        shared.chmod(0o777)
        (shared / "backend.json").write_text(
            json.dumps(
                {
                    "url": f"http://127.0.0.1:{port}",
                    "pid": impostor.pid,
                    "token_file": str(secret),
                    "version": __version__,
                    "api_version": API_VERSION,
                }
            )
        )
        with pytest.raises(CortexError) as refused:
            with Client.local(shared) as client:
                client.whoami()
        assert refused.value.code == "local_dir_unsafe"
        assert "0700" in refused.value.message
        os.chown(shared, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
        shared.chmod(0o700)
        with pytest.raises(CortexError) as refused:
            Client.local(shared)
        assert refused.value.code == "local_dir_unsafe" and "belongs to uid 4242" in refused.value.message
        assert received(log) == ""
    finally:
        stop(impostor)
