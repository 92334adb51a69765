"""How a large chunked upload affects everyone else's requests: p50/p99 of a small API call with nothing
else going on (the baseline, measured in the same run), while the chunks of a 256 MiB frame arrive,
and while the backend assembles, hashes, decodes and checks that frame.

    python bench/bench_upload_latency.py [--mib 256] [--probe-interval 0.01]

The frame is a cross_entropy batch with one out-of-vocabulary id in its very last row, so the backend
reads every byte before it refuses it (400 invalid_batch) and no worker ever trains on it. Goal (issue
13): p99 of other requests at most 50 ms while the upload assembles.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cortex_nb import Client, wire  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402

SEQ_LEN = 128


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


class Prober:
    """GET /v1/jobs?limit=5 in a loop from its own thread; latencies are kept per phase."""

    def __init__(self, url: str, token: str, interval_s: float) -> None:
        self.url, self.token, self.interval_s = url, token, interval_s
        self.phase = "idle"
        self.samples: dict[str, list[float]] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {self.token}"}) as client:
            while not self._stop.is_set():
                phase = self.phase
                started = time.perf_counter()
                try:
                    ok = client.get(self.url + "/v1/jobs", params={"limit": 5}).status_code == 200
                except httpx.HTTPError:
                    ok = False
                elapsed = time.perf_counter() - started
                if not ok:
                    self.errors += 1
                if phase == self.phase:
                    self.samples.setdefault(phase, []).append(elapsed)
                self._stop.wait(self.interval_s)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def big_frame(mib: int, vocab: int) -> bytes:
    rows = max(1, mib * 2**20 // (SEQ_LEN * 20))  # int64 ids + int64 targets + float32 weights per position
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=(rows, SEQ_LEN), dtype=np.int64)
    targets = np.roll(ids, -1, axis=1)
    targets[-1, -1] = vocab + 7  # found only after reading everything
    weights = np.ones((rows, SEQ_LEN), np.float32)
    return wire.encode_frame(
        {"input_ids": ids, "target_tokens": targets, "weights": weights}, {"loss_fn": "cross_entropy"}
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--probe-interval", type=float, default=0.01)
    parser.add_argument("--idle-seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-upload-") as folder:
        backend = start_backend(Path(folder) / "backend", "--devices", "cpu:2", "--warm-workers", "0")
        try:
            client = Client(backend.url, backend.token)
            job = client.create_training_job("tiny", max_seq_len=SEQ_LEN)
            frame = big_frame(args.mib, 259)
            chunks = wire.split_chunks(frame)
            upload_id = "up-" + uuid.uuid4().hex
            headers = {"Authorization": f"Bearer {backend.token}"}
            with (
                Prober(backend.url, backend.token, args.probe_interval) as prober,
                httpx.Client(timeout=300, headers=headers) as http,
            ):
                time.sleep(args.idle_seconds)
                prober.phase = "chunks"
                for chunk in chunks:
                    http.put(
                        f"{backend.url}/v1/uploads/{upload_id}/chunks/{chunk.index}",
                        content=chunk.data,
                        headers={
                            wire.CHUNK_SHA_HEADER: chunk.sha256,
                            wire.CHUNK_COUNT_HEADER: str(len(chunks)),
                        },
                    ).raise_for_status()
                prober.phase = "assembly"
                started = time.perf_counter()
                answer = http.post(
                    f"{backend.url}/v1/jobs/{job.job_id}/forward_backward",
                    headers={wire.UPLOAD_HEADER: upload_id, wire.UPLOAD_SHA_HEADER: wire.sha256_hex(frame)},
                )
                assembly_s = time.perf_counter() - started
                prober.phase = "after"
                time.sleep(0.5)
            job.cancel()
            code = answer.json().get("error", {}).get("code")
            print(
                f"{len(frame) / 2**20:.0f} MiB frame in {len(chunks)} chunks; the backend answered {answer.status_code}"
                f" {code} after {assembly_s:.2f} s of assembly and checks; probe errors: {prober.errors}"
            )
            idle = prober.samples.get("idle", [])
            base = percentile(idle, 0.99)
            print(f"{'phase':<10} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p99 / idle p99':>15}")
            for phase in ("idle", "chunks", "assembly"):
                values = prober.samples.get(phase, [])
                if not values:
                    continue
                p99 = percentile(values, 0.99)
                print(
                    f"{phase:<10} {len(values):>5} {statistics.median(values) * 1000:>8.1f} {p99 * 1000:>8.1f}"
                    f" {max(values) * 1000:>8.1f} {p99 / base:>15.1f}"
                )
            assembly = prober.samples.get("assembly", [])
            if assembly:
                verdict = "meets" if percentile(assembly, 0.99) <= 0.050 else "misses"
                print(f"goal: p99 of other requests <= 50 ms while the upload assembles: {verdict} it")
        finally:
            backend.stop()


if __name__ == "__main__":
    main()
