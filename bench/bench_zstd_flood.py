"""Normal requests while one owner floods the Tinker face with zstd bombs: p50/p99 latency and answers of small
API calls with nothing else going on (the baseline, same run) and while N clients each send, back to back, a
~1 KB zstd body that expands into 15 MiB of two-byte protobuf fields.

    python bench/bench_zstd_flood.py [--flooders 4] [--seconds 10]

Also reports how the bombs were answered (status: count) and the slowest bomb answer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.backend_process import start_backend  # noqa: E402
from tests.tokens import create_token  # noqa: E402


def probe(url: str, token: str, seconds: float) -> list[float]:
    latencies = []
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {token}"}) as client:
        while time.monotonic() < deadline:
            for path in ("/version", "/v1/jobs?limit=5", "/api/v1/healthz"):
                started = time.perf_counter()
                assert client.get(url + path).status_code == 200
                latencies.append(time.perf_counter() - started)
    return latencies


def summary(latencies: list[float], seconds: float) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{len(ordered) / seconds:6.1f} answers/s, p50 {statistics.median(ordered) * 1000:7.1f} ms, p99 {p99 * 1000:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flooders", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    bomb = zstandard.ZstdCompressor(level=19, write_content_size=False).compress(
        b"\x10\x00" * (15 * 1024 * 1024 // 2)
    )
    with tempfile.TemporaryDirectory() as tmp:
        backend = start_backend(Path(tmp) / "data", "--devices", "cpu:1", "--warm-workers", "0")
        try:
            key = create_token(backend.data_dir, "bomber", "jobs:read", "jobs:write", tinker=True)
            idle = probe(backend.url, backend.token, args.seconds)
            stop, answers, slowest = threading.Event(), {}, [0.0]

            def flood() -> None:
                headers = {
                    "X-API-Key": key,
                    "Content-Type": "application/x-protobuf",
                    "Content-Encoding": "zstd",
                }
                with httpx.Client(timeout=300) as client:
                    while not stop.is_set():
                        started = time.perf_counter()
                        status = client.post(
                            backend.url + "/api/v1/forward_backward", content=bomb, headers=headers
                        ).status_code
                        slowest[0] = max(slowest[0], time.perf_counter() - started)
                        answers[status] = answers.get(status, 0) + 1

            threads = [threading.Thread(target=flood) for _ in range(args.flooders)]
            for thread in threads:
                thread.start()
            time.sleep(1.0)
            flooded = probe(backend.url, backend.token, args.seconds)
            stop.set()
            for thread in threads:
                thread.join()
        finally:
            backend.stop()
    print(f"bomb: {len(bomb)} bytes -> 15 MiB; {args.flooders} flooders of one owner")
    print(f"idle:          {summary(idle, args.seconds)}")
    print(f"zstd flood:    {summary(flooded, args.seconds)}")
    print(f"bombs answered {answers}, slowest {slowest[0]:.2f} s")


if __name__ == "__main__":
    main()
