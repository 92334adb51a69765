"""Normal requests while many slow connections hold the backend: p50/p99 latency of small API calls with
nothing else going on (the baseline, same run) and while N connections each trickle a partial body.

    python bench/bench_slow_connections.py [--connections 200] [--seconds 10] [--body-timeout 3]

The slow connections send headers promising 100 kB and then one byte per connection every half second;
the backend closes each once `--http-body-timeout` passes. Also reports how many it closed, and the
backend log's growth (bounded log noise).
"""

from __future__ import annotations

import argparse
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


def probe(url: str, token: str, seconds: float) -> tuple[list[float], int]:
    latencies, failures = [], 0
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"}) as client:
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--body-timeout", type=float, default=3.0)
    args = parser.parse_args()
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
