"""Normal requests while many slow connections hold the backend: p50/p99 latency of small API calls with
nothing else going on (the baseline, same run) and while N connections each trickle a partial body.

    python bench/bench_slow_connections.py [--connections 200] [--seconds 10] [--body-timeout 3]
    python bench/bench_slow_connections.py --silent 1100 [--rate 200]

The slow connections send headers promising 100 kB and then one byte per connection every half second;
the backend closes each once `--http-body-timeout` passes. Also reports how many it closed, and the
backend log's growth (bounded log noise). With `--silent N`, N connections from loopback (more than the
1,000 the backend allows) send half a request line and nothing more, opened at `--rate` a second and
reopened when closed, while each probe request opens a new connection (as a reconnecting client must).
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.backend_process import start_backend  # noqa: E402


def probe(url: str, token: str, seconds: float, fresh: bool = False) -> tuple[list[float], int]:
    """Small API calls for `seconds`; `fresh`: each on a new connection (no keep-alive)."""
    latencies, failures = [], 0
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_keepalive_connections=0) if fresh else httpx.Limits()
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"}, limits=limits) as client:
        while time.monotonic() < deadline:
            for path in ("/version", "/v1/jobs?limit=5", "/v1/capacity"):
                started = time.perf_counter()
                try:
                    ok = client.get(url + path).status_code == 200
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - started)
                failures += not ok
            time.sleep(0.02)
    return latencies, failures


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def silent_flood(url: str, token: str, count: int, rate: float, seconds: float) -> None:
    """Idle probes, then probes while `count` silent connections are held (reopened when closed)."""
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (count + 512, max(count + 512, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    )
    idle, idle_failures = probe(url, token, min(seconds, 5.0), fresh=True)
    address = urlsplit(url)
    target = (address.hostname, address.port)
    held: list[socket.socket] = []
    stop = threading.Event()
    opened = [0]

    def hold() -> None:
        while not stop.is_set():
            alive = []
            for sock in held:  # drop the ones the backend closed
                sock.setblocking(False)
                try:
                    gone = sock.recv(1 << 16) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                (sock.close() if gone else alive.append(sock))
            held[:] = alive
            while len(held) < count and not stop.is_set():
                try:
                    sock = socket.create_connection(target, timeout=10)
                    sock.sendall(b"GET /v1/jobs HT")
                    held.append(sock)
                    opened[0] += 1
                except OSError:
                    pass
                stop.wait(1 / rate)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    time.sleep(count / rate)
    busy, busy_failures = probe(url, token, seconds, fresh=True)
    stop.set()
    thread.join()
    for sock in held:
        sock.close()
    print(f"{'phase':<26} {'n':>5} {'failed':>6} {'p50 ms':>8} {'p99 ms':>8}")
    for label, values, failures in (
        ("idle", idle, idle_failures),
        (f"{count} silent connections", busy, busy_failures),
    ):
        print(
            f"{label:<26} {len(values):>5} {failures:>6} {statistics.median(values) * 1000:>8.1f} {p99(values) * 1000:>8.1f}"
        )
    print(f"p99 ratio (silent / idle): {p99(busy) / p99(idle):.1f}x; silent connections opened: {opened[0]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--body-timeout", type=float, default=3.0)
    parser.add_argument("--silent", type=int, default=0, help="hold this many silent connections instead")
    parser.add_argument("--rate", type=float, default=200.0, help="silent connections opened per second")
    args = parser.parse_args()
    if args.silent:
        with tempfile.TemporaryDirectory(prefix="bench-silent-") as folder:
            backend = start_backend(Path(folder) / "backend", "--devices", "cpu:1", "--warm-workers", "0")
            try:
                silent_flood(backend.url, backend.token, args.silent, args.rate, args.seconds)
            finally:
                backend.stop()
        return
    with tempfile.TemporaryDirectory(prefix="bench-slow-") as folder:
        backend = start_backend(
            Path(folder) / "backend",
            "--devices",
            "cpu:1",
            "--warm-workers",
            "0",
            "--http-body-timeout",
            str(args.body_timeout),
            "--http-idle-timeout",
            str(args.body_timeout),
        )
        try:
            log_before = backend.log_path.stat().st_size if backend.log_path else 0
            idle, idle_failures = probe(backend.url, backend.token, min(args.seconds, 5.0))
            address = urlsplit(backend.url)
            slow = []
            for _ in range(args.connections):
                sock = socket.create_connection((address.hostname, address.port), timeout=30)
                sock.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
                slow.append(sock)
            closed: set[int] = set()
            stop = threading.Event()

            def dribble() -> None:
                while not stop.is_set():
                    for index, sock in enumerate(slow):
                        if index in closed:
                            continue
                        try:
                            sock.sendall(b" ")
                        except OSError:
                            closed.add(index)
                    stop.wait(0.5)

            thread = threading.Thread(target=dribble, daemon=True)
            thread.start()
            busy, busy_failures = probe(backend.url, backend.token, args.seconds)
            stop.set()
            thread.join()
            for sock in slow:
                sock.close()
            log_growth = (backend.log_path.stat().st_size if backend.log_path else 0) - log_before
            print(f"{'phase':<22} {'n':>5} {'failed':>6} {'p50 ms':>8} {'p99 ms':>8}")
            for label, values, failures in (
                ("idle", idle, idle_failures),
                (f"{args.connections} slow bodies", busy, busy_failures),
            ):
                print(
                    f"{label:<22} {len(values):>5} {failures:>6} {statistics.median(values) * 1000:>8.1f} {p99(values) * 1000:>8.1f}"
                )
            print(
                f"p99 ratio (slow / idle): {p99(busy) / p99(idle):.1f}x; slow connections the backend closed:"
                f" {len(closed)}/{args.connections} (body timeout {args.body_timeout:g} s); log grew {log_growth} bytes"
            )
        finally:
            backend.stop()


if __name__ == "__main__":
    main()
