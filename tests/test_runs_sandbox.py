"""The source-run sandbox, tested from outside with real processes: no network under a network
namespace, no credentials, rlimits, timeouts, and no process left behind after cancel or a crash."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cortex_nb import Client

from .backend_process import start_backend
from .conftest import RUNS_BACKEND_SECRETS
from .run_projects import processes_with, wait_for_log, write_project

CONNECT_PROBE = """
    import json, socket, sys
    port = int(sys.argv[1])
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        result = {"connected": True}
    except OSError as exc:
        result = {"connected": False, "error": str(exc)}
    import fcntl, struct
    interfaces = [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]]
    probe = socket.socket()
    flags = {name: struct.unpack("16sH", fcntl.ioctl(probe, 0x8913, struct.pack("256s", name.encode()))[:18])[1]
             for name in interfaces}  # SIOCGIFFLAGS
    result["interfaces"] = interfaces
    result["interfaces_up"] = [name for name, value in flags.items() if value & 1]  # IFF_UP
    json.dump(result, open("net.json", "w"))
"""


@pytest.fixture
def loopback_server():
    """A TCP server on 127.0.0.1 that accepts connections; yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted = []

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            accepted.append(connection)
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


def test_required_isolation_gets_netns_and_cannot_reach_loopback(runs_client, loopback_server, tmp_path):
    port, accepted = loopback_server
    spec = write_project(
        tmp_path / "project",
        CONNECT_PROBE,
        name="netns",
        command=["python", "main.py", str(port)],
        isolation="required",
        outputs={"net": {"path": "net.json"}},
    )
    # The same code outside the sandbox reaches the server.
    outside = tmp_path / "outside"
    outside.mkdir()
    subprocess.run(
        [sys.executable, str(tmp_path / "project" / "main.py"), str(port)],
        cwd=outside,
        check=True,
        timeout=60,
    )
    outside_result = json.loads((outside / "net.json").read_text())
    assert outside_result["connected"] is True and "lo" in outside_result["interfaces_up"]
    assert len(accepted) == 1

    handle = runs_client.run(spec)
    assert handle.wait(120)["status"] == "done", handle.info
    inside = json.loads(handle.outputs("net", tmp_path / "net.json").read_text())
    # A network namespace of its own: only its own loopback, where nothing of the host listens.
    assert inside["connected"] is False and (
        "refused" in inside["error"].lower() or "unreachable" in inside["error"].lower()
    )
    assert inside["interfaces"] == ["lo"]
    assert len(accepted) == 1  # nothing more arrived
    report = handle.report()
    assert report["isolation_tier"] == "netns"
    assert report["isolation"]["processes"] == "pidns" and report["isolation"]["filesystem"] == "bwrap"


def test_run_finds_no_token_file_and_no_secrets_in_its_environment(runs_client, runs_backend, tmp_path):
    token_path = runs_backend.data_dir / "admin.token"
    db_path = runs_backend.data_dir / "cortex.sqlite3"
    secrets = [runs_backend.token, *RUNS_BACKEND_SECRETS.values()]
    spec = write_project(
        tmp_path,
        """
        import json, os, sys
        found = {}
        for name, path in (("token", sys.argv[1]), ("db", sys.argv[2])):
            try:
                found[name] = open(path, "rb").read(64).decode(errors="replace")
            except OSError as exc:
                found[name] = type(exc).__name__
        try:
            found["data_dir"] = os.listdir(sys.argv[3])
        except OSError as exc:
            found["data_dir"] = type(exc).__name__
        found["env"] = dict(os.environ)
        found["proc"] = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            for part in ("environ", "cmdline"):
                try:
                    found["proc"][f"{pid}/{part}"] = open(f"/proc/{pid}/{part}", "rb").read().decode(errors="replace")
                except OSError as exc:
                    found["proc"][f"{pid}/{part}"] = type(exc).__name__
        for home in ("/root", os.path.expanduser("~")):
            try:
                found[f"home:{home}"] = os.listdir(home)
            except OSError as exc:
                found[f"home:{home}"] = type(exc).__name__
        found["capabilities"] = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff:")][0]
        json.dump(found, open("found.json", "w"))
    """,
        name="secrets",
        command=["python", "main.py", str(token_path), str(db_path), str(runs_backend.data_dir)],
        outputs={"found": {"path": "found.json", "max_bytes": 1 << 20}},
    )
    handle = runs_client.run(spec)
    assert handle.wait(120)["status"] == "done", handle.info
    raw = handle.outputs("found", tmp_path / "found.json").read_text()
    found = json.loads(raw)
    assert found["token"] in ("FileNotFoundError", "PermissionError")
    assert found["db"] in ("FileNotFoundError", "PermissionError")
    assert found["data_dir"] in ("FileNotFoundError", "PermissionError") or found["data_dir"] == []
    # The backend's own variables never reach a run; CORTEX_RUN_ATTEMPT is the one it sets for the run.
    inherited = [key for key in found["env"] if key != "CORTEX_RUN_ATTEMPT"]
    assert not any(key.startswith(("CORTEX_", "HF_TOKEN", "JUPYTER", "RUNS_TEST")) for key in inherited)
    assert found["env"]["CORTEX_RUN_ATTEMPT"] == "1"
    for secret in secrets:
        assert secret not in raw
    assert int(found["capabilities"], 16) == 0  # so it cannot unmount what hides the data dir
    # Only the sandbox's own processes are visible: its init and the command.
    assert len({key.split("/")[0] for key in found["proc"]}) <= 3
    # /root shows at most the Python runtime the run needs (bound back read-only), never root's other files.
    runtime = {
        os.path.realpath(path).split("/")[2]
        for path in (sys.base_prefix, sys.prefix)
        if os.path.realpath(path).startswith("/root/")
    }
    assert not isinstance(found["home:/root"], list) or set(found["home:/root"]) <= runtime
    assert found["env"]["HOME"] == "/tmp/cortex-run" and found["home:/tmp/cortex-run"] == ["main.py"]


def test_memory_hog_ends_workload_out_of_memory(runs_client, tmp_path):
    spec = write_project(
        tmp_path,
        """
        blocks = []
        while True:
            blocks.append(bytearray(64 * 1024 * 1024))
    """,
        name="memory-hog",
    )
    handle = runs_client.run(spec)
    final = handle.wait(120)
    assert final["status"] == "failed"
    assert final["failure_code"] == "workload_out_of_memory", (final, handle.logs())
    assert "1.0 GiB" in final["failure_message"] and "MemoryError" in final["failure_message"]
    assert handle.report()["exit_code"] == 1


def test_sleeper_ends_timed_out(runs_client, tmp_path):
    marker = f"sleeper-{random.randrange(10**9)}"
    spec = write_project(
        tmp_path,
        "import sys, time; time.sleep(600)",
        name="sleeper",
        command=["python", "main.py", marker],
        timeout_seconds=2,
    )
    handle = runs_client.run(spec)
    started = time.monotonic()
    final = handle.wait(60)
    assert final["status"] == "failed" and final["failure_code"] == "timed_out"
    assert time.monotonic() - started < 30
    assert "timeout_seconds (2 s)" in final["failure_message"]
    assert processes_with(marker) == []
    report = handle.report()
    assert 2 <= report["wall_seconds"] < 20


def test_local_wait_timeout_never_cancels(runs_client, tmp_path):
    spec = write_project(tmp_path, "import time; time.sleep(3); print('finished anyway')", name="patient")
    handle = runs_client.run(spec)
    with pytest.raises(TimeoutError):
        handle.wait(0.5)
    assert handle.status() in ("pending", "starting", "running")
    assert handle.wait(60)["status"] == "done"
    assert "finished anyway" in handle.logs()


SPAWN_CHILDREN = """
    # A child, and a daemon that double-forks and calls setsid to leave the process group.
    sleep {n} &
    (setsid sh -c 'sleep {n1}' &)
    echo children started
    wait
"""


def _cancel_leaves_no_processes(client: Client, tmp_path) -> dict:
    n = random.randrange(10**6, 10**7)
    spec = write_project(tmp_path, "", name="spawner", command=SPAWN_CHILDREN.format(n=n, n1=n + 1))
    handle = client.run(spec)
    wait_for_log(handle, "children started")
    deadline = time.monotonic() + 10
    while len(processes_with(f"sleep {n}")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    before = processes_with(f"sleep {n}")  # matches "sleep n" and "sleep n1..."
    assert len(before) >= 2, "the children should be visible from the host while the run is running"
    handle.cancel()
    final = handle.wait(60)
    assert final["status"] == "cancelled" and final["failure_code"] == "cancelled"
    assert processes_with(f"sleep {n}") == []
    return handle.report()


def test_cancelled_run_leaves_no_processes_with_pid_namespace(runs_client, tmp_path):
    report = _cancel_leaves_no_processes(runs_client, tmp_path)
    assert report["isolation"]["processes"] == "pidns"


@pytest.fixture(scope="module")
def fallback_backend(tmp_path_factory):
    """A backend with namespaces turned off, as on a host that forbids them. Without a mount namespace
    the run's uid must reach its work dir by itself, so the workspace lives in a world-traversable folder."""
    workspace = tempfile.mkdtemp(prefix="cortex-runs-test-", dir="/tmp")
    os.chmod(workspace, 0o711)
    process = start_backend(
        tmp_path_factory.mktemp("fallback-backend"),
        "--devices",
        "cpu:2",
        "--warm-workers",
        "0",
        "--run-namespaces",
        "off",
        "--run-kill-grace",
        "1",
        "--runs-workspace",
        workspace,
    )
    yield process
    process.stop()
    shutil.rmtree(workspace, ignore_errors=True)


def test_cancelled_run_leaves_no_processes_without_namespaces(fallback_backend, tmp_path):
    with Client(fallback_backend.url, fallback_backend.token) as client:
        report = _cancel_leaves_no_processes(client, tmp_path)
    assert report["isolation"]["processes"] == "subreaper" and report["isolation_tier"] == "none"


def test_required_isolation_without_namespaces_fails_before_the_code_starts(fallback_backend, tmp_path):
    with Client(fallback_backend.url, fallback_backend.token) as client:
        spec = write_project(
            tmp_path, "", name="needs-netns", command="echo THE-CODE-RAN", isolation="required"
        )
        handle = client.run(spec)
        final = handle.wait(60)
        assert final["status"] == "failed" and final["failure_code"] == "isolation_unsupported"
        assert "isolation: best_effort" in final["failure_message"]
        assert not any("THE-CODE-RAN" in line for line in handle.logs())
        best_effort = client.run(write_project(tmp_path / "b", "", name="best", command="echo THE-CODE-RAN"))
        assert best_effort.wait(60)["status"] == "done"
        assert "THE-CODE-RAN" in best_effort.logs()
        assert best_effort.report()["isolation_tier"] == "none"


def test_backend_crash_fails_the_run_and_restart_cleans_up(tmp_path):
    data_dir = tmp_path / "backend"
    backend = start_backend(data_dir, "--devices", "cpu:2", "--warm-workers", "0")
    n = random.randrange(10**6, 10**7)
    with Client(backend.url, backend.token) as client:
        handle = client.run(
            write_project(tmp_path / "p", "", name="crash", command=f"sleep {n} & echo up; wait")
        )
        wait_for_log(handle, "up")
        run_id = handle.run_id
    assert processes_with(f"sleep {n}")
    assert (data_dir / "workspace" / run_id).is_dir()
    backend.kill()  # SIGKILL: no clean shutdown
    deadline = time.monotonic() + 10
    while processes_with(f"sleep {n}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(f"sleep {n}") == []  # the sandbox dies with the backend
    (data_dir / "workspace" / "stray-run").mkdir(parents=True, exist_ok=True)
    restarted = start_backend(data_dir, "--devices", "cpu:2", "--warm-workers", "0")
    try:
        with Client(restarted.url, restarted.token) as client:
            run = client.get_run(run_id)
            assert run["status"] == "failed" and run["failure_code"] == "backend_restarted"
        assert list((data_dir / "workspace").iterdir()) == []
    finally:
        restarted.stop()


def test_runs_work_when_the_backends_python_lives_under_tmp(tmp_path):
    """The sandbox's private /tmp must not hide the interpreter (a checkout under /tmp, as in CI)."""
    root = Path(tempfile.mkdtemp(prefix="cortex-venv-", dir="/tmp"))
    try:
        venv = root / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        here = Path(__file__).resolve().parents[1]
        site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
        paths = [str(here), str(here / "backend"), str(here / "server_extension"), site]
        backend = start_backend(
            tmp_path / "data",
            "--devices",
            "cpu:1",
            "--warm-workers",
            "0",
            env={"PYTHONPATH": os.pathsep.join(paths)},
            python=str(venv / "bin" / "python"),
        )
        try:
            with Client(backend.url, backend.token) as client:
                spec = write_project(
                    tmp_path / "project",
                    """
                    import json, sys
                    json.dump({"prefix": sys.prefix}, open("out.json", "w"))
                """,
                    outputs={"out": {"path": "out.json"}},
                )
                handle = client.run(str(spec))
                info = handle.wait(120)
                assert info["status"] == "done", info
                assert handle.report()["isolation_tier"] == "netns"
        finally:
            backend.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
