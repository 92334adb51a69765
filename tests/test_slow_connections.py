"""Slow and many connections: partial bodies time out, normal requests keep being answered meanwhile,
the connection cap answers 503, and running out of file descriptors neither spins nor floods the log."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from .backend_process import start_backend

SLOW_CONNECTIONS = 200
SLOW_FOR_S = 10.0
BODY_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def guarded_backend(tmp_path_factory):
    process = start_backend(
        tmp_path_factory.mktemp("guarded"),
        "--devices",
        "cpu:1",
        "--warm-workers",
        "0",
        "--http-body-timeout",
        str(BODY_TIMEOUT_S),
        "--http-idle-timeout",
        str(BODY_TIMEOUT_S),
    )
    yield process
    process.stop()


def _slow_request(address: tuple[str, int], token: str | None, index: int) -> socket.socket:
    """A request whose headers promise 100 kB of body, of which a few bytes ever come."""
    sock = socket.create_connection(address, timeout=30)
    path, auth = ("/version", "") if index % 2 else ("/v1/jobs", f"Authorization: Bearer {token}\r\n")
    method = "GET" if index % 2 else "POST"
    sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 100000\r\n\r\n{{".encode())
    return sock


def test_slow_bodies_time_out_while_normal_requests_are_answered(guarded_backend):
    address = urlsplit(guarded_backend.url)
    target = (address.hostname, address.port)
    slow = [_slow_request(target, guarded_backend.token, index) for index in range(SLOW_CONNECTIONS)]
    closed_by_server: set[int] = set()
    stop = threading.Event()

    def dribble() -> None:
        # One byte per connection every half second: never enough to finish a body.
        while not stop.is_set():
            for index, sock in enumerate(slow):
                if index in closed_by_server:
                    continue
                try:
                    sock.sendall(b" ")
                    sock.setblocking(False)
                    try:
                        if sock.recv(65536) == b"":
                            closed_by_server.add(index)
                    except BlockingIOError:
                        pass
                    finally:
                        sock.setblocking(True)
                except OSError:
                    closed_by_server.add(index)
            stop.wait(0.5)

    thread = threading.Thread(target=dribble, daemon=True)
    thread.start()
    failures, latencies = [], []
    headers = {"Authorization": f"Bearer {guarded_backend.token}"}
    deadline = time.monotonic() + SLOW_FOR_S
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < deadline:
            for path in ("/version", "/v1/jobs?limit=5", "/v1/capacity"):
                started = time.perf_counter()
                try:
                    response = client.get(guarded_backend.url + path, headers=headers)
                    if response.status_code != 200:
                        failures.append(f"{path}: {response.status_code}")
                except httpx.HTTPError as exc:
                    failures.append(f"{path}: {exc!r}")
                latencies.append(time.perf_counter() - started)
            time.sleep(0.05)
    stop.set()
    thread.join()
    for sock in slow:
        sock.close()
    assert failures == []
    assert len(latencies) > 20
    # Every slow connection was closed by the backend once its body deadline passed (3 s of the 10).
    assert len(closed_by_server) == SLOW_CONNECTIONS, f"{SLOW_CONNECTIONS - len(closed_by_server)} still open"
    latencies.sort()
    print(
        f"normal requests during {SLOW_CONNECTIONS} slow bodies: n={len(latencies)}"
        f" p50={latencies[len(latencies) // 2] * 1000:.1f} ms p99={latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms"
    )
    assert guarded_backend.healthy()
    assert os.path.getsize(guarded_backend.log_path or guarded_backend.data_dir / "backend.log") < 256 * 1024


def test_connections_past_the_cap_get_a_503_and_the_backend_recovers(tmp_path):
    # With 96 descriptors the cap is 48 connections (half the open-files limit).
    backend = start_backend(
        tmp_path / "capped",
        "--devices",
        "cpu:1",
        "--warm-workers",
        "0",
        prefix=["prlimit", "--nofile=96:96", "--"],
    )
    address = urlsplit(backend.url)
    held: list[socket.socket] = []
    try:
        refused = 0
        for _ in range(120):
            sock = socket.create_connection((address.hostname, address.port), timeout=10)
            held.append(sock)
        for sock in held:
            sock.setblocking(False)
        time.sleep(1.0)
        for sock in held:
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                continue
            if data.startswith(b"HTTP/1.1 503") and b"too_many_connections" in data:
                refused += 1
        assert refused >= 120 - 48 - 5
        for sock in held:
            sock.close()
        held.clear()
        deadline = time.monotonic() + 30
        while not backend.healthy() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert backend.healthy()
    finally:
        for sock in held:
            sock.close()
        backend.stop()


GUARDED_SERVER = textwrap.dedent("""
    import asyncio, logging, sys
    import tornado.httpserver, tornado.netutil, tornado.web
    from cortex_backend.connections import GuardedHTTPServer
    from cortex_backend.log_limits import install

    class Ok(tornado.web.RequestHandler):
        def get(self):
            self.write("ok")

    async def main():
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        for handler in logging.getLogger().handlers:
            install(handler)
        kind = sys.argv[1]
        app = tornado.web.Application([("/", Ok)])
        server = GuardedHTTPServer(app) if kind == "guarded" else tornado.httpserver.HTTPServer(app)
        server.max_connections = 10_000  # no cap: let descriptors run out
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        server.add_sockets(sockets)
        print(sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_out_of_descriptors(kind: str, hold_s: float = 3.0) -> dict:
    """Hold more connections than a server started with 64 descriptors can accept; what did it do?"""
    process = subprocess.Popen(
        ["prlimit", "--nofile=64:64", "--", sys.executable, "-c", GUARDED_SERVER, kind],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(process.stdout.readline())
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(100)]
        before = _cpu_seconds(process.pid)
        time.sleep(hold_s)
        cpu = _cpu_seconds(process.pid) - before
        for sock in held:
            sock.close()
        deadline = time.monotonic() + 20
        answered = False
        while time.monotonic() < deadline and not answered:
            try:
                answered = httpx.get(f"http://127.0.0.1:{port}/", timeout=2).text == "ok"
            except httpx.HTTPError:
                time.sleep(0.2)
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=20)
    return {"cpu_seconds": cpu, "log_lines": len(stderr.splitlines()), "answered_after": answered}


def test_running_out_of_descriptors_neither_spins_nor_floods_the_log():
    result = run_out_of_descriptors("guarded")
    assert result["answered_after"]
    assert result["log_lines"] < 50, result
    # Paused, not spinning: well under one core for the three seconds held.
    assert result["cpu_seconds"] < 1.5, result


def test_silent_connections_from_loopback_do_not_starve_normal_requests(tmp_path):
    """Connections that never send a request (slowloris), opened from the same address as the real
    clients and many more than the cap, keep coming; each new real request is still answered."""
    backend = start_backend(
        tmp_path / "silent", "--devices", "cpu:1", "--warm-workers", "0", "--max-connections", "64"
    )
    address = urlsplit(backend.url)
    target = (address.hostname, address.port)
    silent: list[socket.socket] = []
    stop = threading.Event()

    def keep_opening() -> None:
        # 50 new silent connections a second, none ever closed by us: 300 in all, five times the cap.
        while not stop.is_set() and len(silent) < 300:
            try:
                sock = socket.create_connection(target, timeout=10)
                sock.sendall(b"GET /v1/jobs HT")  # a request line that never ends
                silent.append(sock)
            except OSError:
                pass
            stop.wait(0.02)

    opener = threading.Thread(target=keep_opening, daemon=True)
    opener.start()
    try:
        wait_for = time.monotonic() + 30
        while len(silent) < 100 and time.monotonic() < wait_for:
            time.sleep(0.05)
        statuses, latencies = [], []
        for _ in range(40):
            started = time.perf_counter()
            try:
                # A new connection each time, as a client that reconnects would open.
                statuses.append(httpx.get(backend.url + "/version", timeout=30).status_code)
            except httpx.HTTPError as exc:
                statuses.append(type(exc).__name__)
            latencies.append(time.perf_counter() - started)
            time.sleep(0.1)
        assert statuses == [200] * 40, statuses
        latencies.sort()
        print(
            f"new-connection requests among {len(silent)} silent connections (cap 64): "
            f"p50={latencies[20] * 1000:.1f} ms p99={latencies[-1] * 1000:.1f} ms"
        )
    finally:
        stop.set()
        opener.join(10)
        for sock in silent:
            sock.close()
        backend.stop()
