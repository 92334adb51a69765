"""Observability costs and latencies, measured on this machine:

1. log latency, from a worker's print to a client following the job's logs (follow stream and
   long-poll), against the 0.5 s the design promises;
2. the device monitor's CPU overhead in percent of one core at 1 s and 0.1 s intervals, against an
   idle baseline measured in the same run;
3. client telemetry's cost per operation: a `get_job` round trip with telemetry off and on.

    python bench/bench_observability.py [--lines 200] [--monitor-seconds 15]

A log line's `at` is stamped by the backend when it reads the line from the worker's pipe; the
pipe hop itself (print -> read) is measured separately with the same asyncio reading code, so
print -> client = pipe hop + capture -> client.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cortex_nb import Client  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402

BATCH = {"input_ids": [[1, 2]], "target_tokens": [[2, 3]], "weights": [[1.0, 1.0]]}
TARGET_S = 0.5


def percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


# 1. log latency ------------------------------------------------------------------------------------
def pipe_hop(lines: int) -> list[float]:
    """print -> asyncio readline in the parent, the way the executor reads a worker's stdout."""
    child = (
        f"import time\nfor _ in range({lines}):\n    print(time.time(), flush=True)\n    time.sleep(0.01)\n"
    )

    async def run() -> list[float]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            child,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        delays = []
        while raw := await process.stdout.readline():
            delays.append(time.time() - float(raw))
        await process.wait()
        return delays

    return asyncio.run(run())


def log_latency(lines: int) -> dict[str, list[float]]:
    backend = start_backend(
        Path(tempfile.mkdtemp(prefix="cortex-bench-")), "--devices", "cpu:2", "--worker-threads", "1"
    )
    try:
        with Client(backend.url, backend.token) as client, Client(backend.url, backend.token) as reader:
            job = client.create_training_job("tiny", lora={"r": 1, "target_modules": ["q_proj"]})
            start_cursor = client.tail_logs(job.job_id)["cursor"]
            streamed: list[float] = []
            polled: list[float] = []

            def follow() -> None:
                for line in reader.stream_logs(job.job_id, cursor=start_cursor):
                    streamed.append(time.time() - line["at"])

            def long_poll() -> None:
                with Client(backend.url, backend.token) as poller:
                    cursor = start_cursor
                    while True:
                        page = poller.tail_logs(job.job_id, cursor, wait_s=10)
                        now = time.time()
                        polled.extend(now - line["at"] for line in page["lines"])
                        cursor = page["cursor"]
                        if page["job_status"] in ("done", "failed", "cancelled") and not page["lines"]:
                            return

            threads = [threading.Thread(target=follow), threading.Thread(target=long_poll)]
            for thread in threads:
                thread.start()
            time.sleep(0.5)
            for _ in range(lines):  # one engine line each, paced so lines arrive one at a time
                client.forward_backward(job.job_id, BATCH)
                time.sleep(0.05)
            client.complete_job(job.job_id)
            for thread in threads:
                thread.join(300)
            return {"stream": streamed, "long_poll": polled}
    finally:
        backend.stop()


# 2. monitor overhead ----------------------------------------------------------------------------------
def monitor_overhead(interval_s: float | None, seconds: float) -> tuple[float, int]:
    """CPU seconds this process used in `seconds` of wall time with a monitor at `interval_s`
    (None: no monitor, the idle baseline), and how many samples it took."""
    sys.path.insert(0, str(ROOT / "backend"))
    from cortex_backend.devices import detect_devices
    from cortex_backend.monitor import Monitor
    from cortex_backend.store import Store

    with tempfile.TemporaryDirectory() as folder:
        store = Store(Path(folder) / "cortex.sqlite3")
        store.insert_job(
            {"id": "job-bench", "owner": "bench", "status": "running", "spec": {}},
            [{"id": "training-0", "type": "training", "status": "running", "spec": {}}],
        )
        store.update_sub_job("job-bench", "training-0", device="cpu")
        monitor = Monitor(store, detect_devices("auto", 4), interval_s or 1.0) if interval_s else None
        started = time.process_time()
        if monitor:
            monitor.start()
        time.sleep(seconds)
        if monitor:
            monitor.stop()
        used = time.process_time() - started
        store.close()
        return used, monitor.samples_taken if monitor else 0


# 3. telemetry cost --------------------------------------------------------------------------------------
def telemetry_cost(calls: int) -> dict[str, float]:
    """Median `get_job` round trip per telemetry setting, the settings interleaved call by call so
    that load from elsewhere on the machine falls on all of them alike."""
    backend = start_backend(
        Path(tempfile.mkdtemp(prefix="cortex-bench-")),
        "--devices",
        "cpu:1",
        "--warm-workers",
        "0",
        "--monitor-interval",
        "0",
    )
    settings = {
        "off": (False, False),
        "on (failures sent)": (True, False),
        "on, successes sent": (True, True),
    }
    try:
        clients = {label: Client(backend.url, backend.token) for label in settings}
        for label, (enabled, successes) in settings.items():
            clients[label].telemetry.enabled = enabled
            clients[label].telemetry.send_successes = successes
        job_id = clients["off"].create_job([{"type": "training", "base_model": "tiny"}])["job_id"]
        clients["off"].cancel_job(job_id)
        time.sleep(2.0)  # let the cancelled job's worker go, so it does not load the machine
        timings: dict[str, list[float]] = {label: [] for label in settings}
        for _ in range(calls):
            for label, client in clients.items():
                started = time.perf_counter()
                client.get_job(job_id)
                timings[label].append(time.perf_counter() - started)
        for client in clients.values():
            client.telemetry.flush(10)
            client.close()
        return {label: statistics.median(values) for label, values in timings.items()}
    finally:
        backend.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--monitor-seconds", type=float, default=15.0)
    parser.add_argument("--telemetry-calls", type=int, default=300)
    args = parser.parse_args()
    print(f"host: {os.cpu_count()} CPU(s), python {sys.version.split()[0]}")

    hop = pipe_hop(args.lines)
    hop50, hop95 = percentiles(hop)
    print(f"\n[log latency] {args.lines} engine lines, one every ~50 ms")
    print(f"  pipe hop (print -> backend read)       p50 {hop50 * 1000:7.2f} ms   p95 {hop95 * 1000:7.2f} ms")
    latency = log_latency(args.lines)
    for mode, values in latency.items():
        p50, p95 = percentiles(values)
        print(
            f"  {mode:<10} capture -> client ({len(values):>4} lines) p50 {p50 * 1000:7.2f} ms   p95 {p95 * 1000:7.2f} ms"
            f"   print -> client p95 ~{(p95 + hop95) * 1000:7.2f} ms = {(p95 + hop95) / TARGET_S:.3f} x the {TARGET_S} s target"
        )

    print(
        f"\n[monitor overhead] {args.monitor_seconds:.0f} s each, CPU of this process (percent of one core)"
    )
    idle, _ = monitor_overhead(None, args.monitor_seconds)
    print(f"  idle baseline            {idle / args.monitor_seconds * 100:6.3f} %")
    for interval in (1.0, 0.1):
        used, samples = monitor_overhead(interval, args.monitor_seconds)
        overhead = (used - idle) / args.monitor_seconds * 100
        per_tick = (used - idle) / max(samples, 1) * 1000
        print(
            f"  interval {interval:>4} s  {samples:>4} samples  {overhead:6.3f} % of one core"
            f"  ({per_tick:.2f} ms CPU per tick)"
        )

    from cortex_nb.telemetry import Telemetry

    recorder = Telemetry("http://127.0.0.1:9", enabled=True, send_successes=False)
    started = time.perf_counter()
    for _ in range(10_000):
        recorder.record("get_job", success=True, duration_ms=1.0, attempts=1)
    print(
        f"\n[telemetry] record() on the caller's thread: {(time.perf_counter() - started) / 10_000 * 1e6:.1f} us"
    )
    print(f"  median get_job round trip over {args.telemetry_calls} calls")
    costs = telemetry_cost(args.telemetry_calls)
    off = costs["off"]
    for label, seconds in costs.items():
        print(
            f"  telemetry {label:<20} {seconds * 1000:7.3f} ms   {seconds / off:.3f} x off"
            f"   (+{(seconds - off) * 1000:.3f} ms)"
        )


if __name__ == "__main__":
    main()
