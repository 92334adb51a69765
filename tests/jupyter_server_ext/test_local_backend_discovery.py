"""With no backend configured, the Jupyter server uses the user's local backend: found through its state
file (the same one `%cortex connect --local` uses), with the non-admin token that file names, seen as
soon as it starts or dies. Starting it from the sidebar ("Start local backend") is exercised in the
browser (tests/test_lab_new_user_browser.py); here, that a configured backend is never replaced."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from tornado.httpclient import HTTPClientError
from traitlets.config import Config

from cortex_nb import __version__
from cortex_nb.protocol.versions import API_VERSION

from ..impostor import attacker_folder, received, start_impostor, stop
from ..tokens import create_token
from ..unprivileged import unavailable_reason
from .test_server_extension import body, fetch_error, server_config

USER_SCOPES = ("jobs:read", "jobs:write", "runs:write")


@pytest.fixture
def local_dir(tmp_path):
    return tmp_path / "local"


@pytest.fixture
def jp_server_config(local_dir, monkeypatch):
    # Nothing configured: no trait, no CORTEX_URL; only where the local backend's state file lives.
    monkeypatch.delenv("CORTEX_URL", raising=False)
    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {"cortex_server": True},
                "allow_unauthenticated_access": False,
            },
            "CortexServerApp": {"local_dir": str(local_dir)},
        }
    )


@pytest.fixture(scope="module")
def user_token(backend):
    """A token like the one a local backend writes to user.token: the user's own, not admin."""
    return create_token(backend.data_dir, "local-user", *USER_SCOPES)


def write_state_file(local_dir, *, url: str, pid: int, token_file, proof_of=None) -> None:
    """A state file for `url`; with `proof_of` (a running backend), the start time and nonce from that
    backend's own state file, which the proxy checks before it sends a token."""
    local_dir.mkdir(parents=True, exist_ok=True)
    local_dir.chmod(0o700)
    state = {
        "url": url,
        "pid": pid,
        "token_file": str(token_file),
        "version": __version__,
        "api_version": API_VERSION,
        "started_at": time.time(),
        "data_dir": str(local_dir),
    }
    if proof_of is not None:
        own = json.loads((proof_of.data_dir / "backend.json").read_text())
        state.update({key: own[key] for key in ("pid_start", "nonce") if key in own})
    (local_dir / "backend.json").write_text(json.dumps(state))


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


async def test_with_no_local_backend_the_status_says_so_and_offers_to_start_one(jp_fetch, local_dir):
    status = body(await jp_fetch("cortex", "api", "status"))
    assert status["reachable"] is False and status["backend_url"] is None
    assert status["source"]["kind"] == "local" and status["source"]["can_start_local"] is True
    assert status["source"]["state_file"] == str(local_dir / "backend.json")
    assert status["error"]["code"] == "backend_unavailable"
    assert status["error"]["detail"] == {"local_backend": "not_running"}
    assert "Start local backend" in status["error"]["message"]
    code, error = await fetch_error(jp_fetch, "cortex", "api", "v1", "jobs")
    assert (code, error["error"]["code"]) == (502, "backend_unavailable")
    assert error["error"]["detail"] == {"local_backend": "not_running"}


async def test_the_local_backend_is_found_through_its_state_file_with_its_user_token(
    jp_fetch, local_dir, backend, user_token, tmp_path
):
    local_dir.mkdir(mode=0o700, exist_ok=True)
    token_file = local_dir / "user.token"  # the proxy takes a token file only from the state file's own dir
    token_file.write_text(user_token)
    token_file.chmod(0o600)
    assert body(await jp_fetch("cortex", "api", "status"))["reachable"] is False

    # The backend appears: the very next call sees it (no restart of Jupyter, no wait).
    write_state_file(local_dir, url=backend.url, pid=backend.pid, token_file=token_file, proof_of=backend)
    status = body(await jp_fetch("cortex", "api", "status"))
    assert status["reachable"] is True and status["authenticated"] is True, status
    assert status["backend_url"] == backend.url
    assert status["source"]["kind"] == "local" and status["source"]["pid"] == backend.pid
    assert str(local_dir / "backend.json") in status["source"]["description"]
    # The user's token, never the admin one: jobs made here belong to the user, as a kernel's do.
    assert status["identity"] == {"owner": "local-user", "scopes": list(USER_SCOPES)}
    created = body(
        await jp_fetch(
            "cortex",
            "api",
            "v1",
            "jobs",
            method="POST",
            body=json.dumps({"sub_jobs": [{"type": "sampling", "base_model": "tiny"}]}),
        )
    )
    try:
        assert created["owner"] == "local-user"
    finally:
        await jp_fetch("cortex", "api", "v1", "jobs", created["job_id"], "cancel", method="POST", body=b"{}")

    # It dies (its process is gone, the state file left behind): the next call says so.
    write_state_file(local_dir, url=backend.url, pid=dead_pid(), token_file=token_file)
    status = body(await jp_fetch("cortex", "api", "status"))
    assert status["reachable"] is False and status["error"]["detail"] == {"local_backend": "not_running"}


@pytest.mark.parametrize("jp_server_config", [server_config("http://127.0.0.1:9", "/nonexistent")])
async def test_a_configured_backend_is_used_as_given_and_never_started(jp_fetch, jp_server_config):
    status = body(await jp_fetch("cortex", "api", "status"))
    assert status["source"]["kind"] == "config" and status["source"]["can_start_local"] is False
    assert status["backend_url"] == "http://127.0.0.1:9"
    with pytest.raises(HTTPClientError) as caught:
        await jp_fetch("cortex", "api", "local", "start", method="POST", body=b"{}")
    assert caught.value.code == 409
    assert json.loads(caught.value.response.body)["error"]["code"] == "conflict"


@pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")
async def test_a_stale_state_file_sends_no_token_to_another_users_listener(
    jp_fetch, local_dir, backend, user_token
):
    """After a crash the state file still names the backend's pid and port; here both went to a listener of
    another uid (the pid reused, the port taken). The proxy must not forward the user's token to it."""
    local_dir.mkdir(mode=0o700, exist_ok=True)
    token_file = local_dir / "user.token"
    token_file.write_text(user_token)
    token_file.chmod(0o600)
    with attacker_folder() as folder:
        impostor, log = start_impostor(folder, 0)
        try:
            port = int((folder / "port.txt").read_text())
            # the backend's own start time and nonce, as its stale file would still hold them
            write_state_file(
                local_dir,
                url=f"http://127.0.0.1:{port}",
                pid=impostor.pid,
                token_file=token_file,
                proof_of=backend,
            )
            status = body(await jp_fetch("cortex", "api", "status"))
            assert status["reachable"] is False and status["backend_url"] is None
            code, error = await fetch_error(jp_fetch, "cortex", "api", "v1", "jobs")
            assert (code, error["error"]["code"]) == (502, "backend_unavailable")
            assert received(log) == ""
        finally:
            stop(impostor)
