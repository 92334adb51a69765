"""The Ray executor against the local executor, as ratios measured in one run on this host.

    python bench/bench_ray.py [--repeats N] [--rank R]

- forward_backward + step (tiny, batch 8x128) through Ray vs the local executor, same host, 1 thread each
  (torch and OpenMP)
- no-op request round trip (submit + result), Ray vs local; and no-op requests/s with 64 in flight
- weight sync between two Ray nodes (trainer on host a, sampler on host b): time and bytes, delta and
  full, against the same sync between two local workers
- log lines/s the head's log book takes (SQLite appends, the ceiling for every executor)

The local and Ray backends run side by side and their measurements alternate call by call, so load from
other processes hits both. The Ray cluster is two nodes on this machine (the head "a" and a joined "b").
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cortex_nb import Client  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402
from tests.ray_cluster import start_ray_cluster  # noqa: E402
from tests.training_data import text_batch  # noqa: E402


def elapsed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def batch(rows: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, size=(rows, length + 1))
    return {
        "input_ids": tokens[:, :-1],
        "target_tokens": tokens[:, 1:],
        "weights": np.ones((rows, length), np.float32),
    }


def row(label: str, value: float, digits: int = 2) -> None:
    print(f"{label:66s} {value:12.{digits}f}")


def noop_rate(client: Client, job_id: str, count: int, in_flight: int = 64) -> float:
    """No-op requests per second with `in_flight` clients submitting and polling at once."""

    def one(_: int) -> None:
        client.poll_request(job_id, client.noop(job_id))

    started = time.perf_counter()
    with ThreadPoolExecutor(in_flight) as pool:
        list(pool.map(one, range(count)))
    return count / (time.perf_counter() - started)


def log_book_rate(lines: int) -> float:
    """Lines/s appended to a log book on a fresh store, in batches as a busy worker sends them."""
    from cortex_backend.logs import LogBook
    from cortex_backend.store import Store

    with tempfile.TemporaryDirectory() as directory:
        store = Store(Path(directory) / "bench.sqlite3")
        book = LogBook(store, 1_000_000)
        batch_lines = [(time.time(), f"[engine] line {n} " + "x" * 60) for n in range(50)]
        started = time.perf_counter()
        for _ in range(lines // 50):
            book.append("job-bench", "training-0", "stdout", batch_lines)
        rate = lines / (time.perf_counter() - started)
        store.close()
        return rate


def sync_once(job, weight_format: str) -> tuple[float, int]:
    job.forward_backward(text_batch()).result()
    job.step().result()
    started = time.perf_counter()
    result = job.sync_sampler(weight_format=weight_format).result()
    return time.perf_counter() - started, result["bytes"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--rank", type=int, default=64, help="LoRA rank of the weight-sync jobs (bytes grow with it)"
    )
    args = parser.parse_args()
    data = batch(8, 128)
    median = statistics.median
    work = Path(tempfile.mkdtemp(prefix="cortex-bench-ray-"))
    # Like for like: a Ray actor that reserves one CPU runs with OMP_NUM_THREADS=1 (Ray sets it), so the
    # local workers get the same; both run torch with one thread (--worker-threads 1).
    local = start_backend(
        work / "local", "--devices", "cpu:2", "--worker-threads", "1", env={"OMP_NUM_THREADS": "1"}
    )
    cluster = None
    try:
        cluster = start_ray_cluster(work / "ray")
        cluster.join("b")
        with Client(local.url, local.token) as local_client, cluster.client() as ray_client:
            # 1. forward_backward + step, and no-op round trips: one trainer each, on this host.
            local_job = local_client.create_training_job("tiny", lora={"r": 16, "alpha": 32})
            ray_job = ray_client.create_training_job("tiny", lora={"r": 16, "alpha": 32})
            local_job.wait_ready(timeout_s=600)
            ray_job.wait_ready(timeout_s=600)

            def fb_step(job) -> None:
                job.forward_backward(data)
                job.step().result()

            fb_step(local_job)
            fb_step(ray_job)
            local_fb, ray_fb = [], []
            for _ in range(args.repeats):
                local_fb.append(elapsed(lambda: fb_step(local_job)))
                ray_fb.append(elapsed(lambda: fb_step(ray_job)))
            local_noop, ray_noop = [], []
            for _ in range(args.repeats * 10):
                local_noop.append(
                    elapsed(
                        lambda: local_client.poll_request(
                            local_job.job_id, local_client.noop(local_job.job_id)
                        )
                    )
                )
                ray_noop.append(
                    elapsed(lambda: ray_client.poll_request(ray_job.job_id, ray_client.noop(ray_job.job_id)))
                )
            local_rate = noop_rate(local_client, local_job.job_id, args.repeats * 50)
            ray_rate = noop_rate(ray_client, ray_job.job_id, args.repeats * 50)
            local_job.cancel()
            ray_job.cancel()

            # 2. weight sync: trainer and sampler on two Ray nodes (one slot each) vs two local workers.
            ray_pair = ray_client.create_training_job(
                "tiny", samplers=1, lora={"r": args.rank, "alpha": args.rank}
            )
            local_pair = local_client.create_training_job(
                "tiny", samplers=1, lora={"r": args.rank, "alpha": args.rank}
            )
            ray_pair.wait_ready(timeout_s=600)
            local_pair.wait_ready(timeout_s=600)
            hosts = {
                sub["sub_job_id"]: sub["info"]["host"]
                for sub in ray_client.get_job(ray_pair.job_id)["sub_jobs"]
            }
            assert hosts["training-0"] != hosts["sampling-0"], hosts
            sync: dict[tuple[str, str], list[tuple[float, int]]] = {}
            for _ in range(max(3, args.repeats // 2)):
                for name, job in (("local", local_pair), ("ray", ray_pair)):
                    for weight_format in ("lora", "full"):
                        sync.setdefault((name, weight_format), []).append(sync_once(job, weight_format))
            ray_pair.cancel()
            local_pair.cancel()
    finally:
        if cluster is not None:
            cluster.stop()
        local.stop()
        shutil.rmtree(work, ignore_errors=True)
    log_rate = log_book_rate(50_000)

    def sync_row(name: str, weight_format: str) -> tuple[float, float]:
        times = [seconds for seconds, _ in sync[(name, weight_format)]]
        sizes = [size for _, size in sync[(name, weight_format)]]
        return median(times), median(sizes)

    print(f"{'measure (medians)':66s} {'value':>12s}")
    row("forward_backward + step 8x128, local executor (ms)", median(local_fb) * 1000)
    row("forward_backward + step 8x128, Ray executor, same host (ms)", median(ray_fb) * 1000)
    row("  ratio Ray / local (goal <= 1.05)", median(ray_fb) / median(local_fb), 3)
    row("no-op round trip, local executor (ms)", median(local_noop) * 1000)
    row("no-op round trip, Ray executor (ms)", median(ray_noop) * 1000)
    row("  ratio Ray / local", median(ray_noop) / median(local_noop))
    row("no-op requests/s, 64 in flight, local executor", local_rate, 0)
    row("no-op requests/s, 64 in flight, Ray executor", ray_rate, 0)
    for weight_format, label in (("lora", "delta"), ("full", "full")):
        local_s, local_bytes = sync_row("local", weight_format)
        ray_s, ray_bytes = sync_row("ray", weight_format)
        row(f"weight sync r={args.rank} {label}: bytes sent, Ray node a -> node b", ray_bytes, 0)
        row(f"weight sync r={args.rank} {label}: time, local workers (ms)", local_s * 1000)
        row(f"weight sync r={args.rank} {label}: time, Ray node a -> node b (ms)", ray_s * 1000)
        row(f"  ratio Ray / local ({label}; bytes equal: {ray_bytes == local_bytes})", ray_s / local_s)
    row("log lines/s into the head's log book (SQLite, batches of 50)", log_rate, 0)


if __name__ == "__main__":
    main()
