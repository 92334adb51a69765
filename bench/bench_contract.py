"""What the typed contract costs: a no-op request's round trip, a job listing, and a small training step
(forward_backward 4x64 + step), against a backend built from an earlier tree (default: `main`), measured
in one run.

    python bench/bench_contract.py [--before main] [--repeats 200] [--train-repeats 40]

`--before dd68d89^` is main just before the backend's inside was typed (worker messages, the operations
catalog, the executor split).

`--before 9f1095f` is main just before the typed contract landed (its handlers wrote dicts with
json.dumps); `--before HEAD` measures the bench's own noise (both sides the same code). Both backends run
side by side (tiny, two CPU slots each: a sampling job and a training job) and their calls alternate, each going first every other time, so
load from other processes hits both. The goal is a ratio <= 1.0 (the models must not make a round trip
slower). It also prints the CPU time each backend process, and its workers, spent per loop (one no-op
round trip and one listing): on a shared, loaded machine a round trip's wall time swings by several
percent from run to run, the CPU it costs much less. And the in-process cost of rendering one job row
through its schema against `json.dumps`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from cortex_nb import Client  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402


def elapsed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User + system time so far of a backend process, and of its workers together."""
    process = psutil.Process(pid)
    spent = []
    for member in (process, *process.children(recursive=True)):
        try:
            times = member.cpu_times()
        except psutil.NoSuchProcess:
            continue
        spent.append(times.user + times.system)
    return spent[0], sum(spent[1:])


def checkout(ref: str, into: Path) -> Path:
    """The tree of `ref` (its Python sources), unpacked under `into`."""
    archive = into / "tree.tar"
    subprocess.run(
        ["git", "archive", "--format=tar", "-o", str(archive), ref, "cortex_nb", "backend"],
        cwd=ROOT,
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def train_batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, size=(4, 65))
    return {
        "input_ids": tokens[:, :-1],
        "target_tokens": tokens[:, 1:],
        "weights": np.ones((4, 64), np.float32),
    }


def render_cost(client: Client, job_id: str, repeats: int) -> tuple[float, float]:
    from cortex_nb.protocol.schemas.base import render
    from cortex_nb.protocol.schemas.jobs import JobView

    row = client.get_job(job_id)
    typed = statistics.median(elapsed(lambda: render(JobView, row)) for _ in range(repeats))
    plain = statistics.median(elapsed(lambda: json.dumps(row)) for _ in range(repeats))
    return typed, plain


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main", help="git ref of the tree to compare with")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--train-repeats", type=int, default=40)
    args = parser.parse_args()
    os.environ.setdefault("CORTEX_DISABLE_TELEMETRY", "1")
    with tempfile.TemporaryDirectory(prefix="cortex-contract-") as tmp:
        tree = checkout(args.before, Path(tmp))
        # `python -m` puts the working directory first on sys.path: run both backends from outside this
        # checkout, so the earlier one imports the earlier tree.
        os.chdir(tmp)
        before_env = {
            "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "backend")]),
            "CORTEX_STRICT_REPLIES": "0",
        }
        common = ("--devices", "cpu:2", "--worker-threads", "1")
        before = start_backend(Path(tmp) / "before", *common, env=before_env)
        after = start_backend(Path(tmp) / "after", *common, env={"CORTEX_STRICT_REPLIES": "0"})
        try:
            with Client(before.url, before.token) as old, Client(after.url, after.token) as new:
                jobs = {
                    name: client.create_job([{"type": "sampling", "base_model": "tiny"}])["job_id"]
                    for name, client in (("before", old), ("after", new))
                }
                for name, client in (("before", old), ("after", new)):
                    client.poll_request(
                        jobs[name], client.noop(jobs[name]), timeout_s=300
                    )  # the worker is up
                times: dict[str, dict[str, list[float]]] = {
                    "before": {"noop": [], "list": []},
                    "after": {"noop": [], "list": []},
                }
                pids = {"before": before.pid, "after": after.pid}
                cpu_at_start = {name: cpu_seconds(pid) for name, pid in pids.items()}
                pair = (("before", old), ("after", new))
                for repeat in range(args.repeats):
                    # Each goes first every other time: the one that follows runs while the other's last
                    # answer is still being finished (its worker, its backend's bookkeeping).
                    for name, client in pair if repeat % 2 == 0 else pair[::-1]:
                        job_id = jobs[name]
                        times[name]["noop"].append(
                            elapsed(lambda c=client, j=job_id: c.poll_request(j, c.noop(j)))
                        )
                        times[name]["list"].append(elapsed(lambda c=client: c.list_jobs()))
                cpu = {
                    name: [now - then for now, then in zip(cpu_seconds(pid), cpu_at_start[name], strict=True)]
                    for name, pid in pids.items()
                }
                typed, plain = render_cost(new, jobs["after"], args.repeats)
                data = train_batch()
                trainers = {
                    name: client.create_training_job("tiny", lora={"r": 16, "alpha": 32})
                    for name, client in pair
                }
                for trainer in trainers.values():
                    trainer.forward_backward(data).result(timeout_s=300)  # the worker is up, warm
                    trainer.step().result(timeout_s=300)
                times["before"]["train"], times["after"]["train"] = [], []
                names = ("before", "after")
                for repeat in range(args.train_repeats):
                    for name in names if repeat % 2 == 0 else names[::-1]:
                        trainer = trainers[name]
                        times[name]["train"].append(
                            elapsed(lambda t=trainer: (t.forward_backward(data).result(), t.step().result()))
                        )
        finally:
            before.stop()
            after.stop()
    for what, label in (
        ("noop", "no-op request, submit + result (ms)"),
        ("list", "GET /v1/jobs (ms)"),
        ("train", "forward_backward 4x64 + step (ms)"),
    ):
        old_ms = statistics.median(times["before"][what]) * 1000
        new_ms = statistics.median(times["after"][what]) * 1000
        print(
            f"{label:42s} before {old_ms:7.2f}  after {new_ms:7.2f}  ratio after/before {new_ms / old_ms:.3f}"
        )
    for index, label in ((0, "backend process CPU per loop (ms)"), (1, "its workers' CPU per loop (ms)")):
        old_cpu, new_cpu = (cpu[name][index] / args.repeats * 1000 for name in ("before", "after"))
        print(
            f"{label:42s} before {old_cpu:7.2f}  after {new_cpu:7.2f}"
            f"  ratio after/before {new_cpu / max(old_cpu, 1e-9):.3f}"
        )
    print(f"{'one job row: schema render / json.dumps':42s} {typed * 1e6:7.1f} us / {plain * 1e6:6.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
