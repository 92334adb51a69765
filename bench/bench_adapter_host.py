"""Adapter host vs a process per sub-job: memory, aggregate training speed and sampling speed, as ratios
within one run.

    python bench/bench_adapter_host.py [--slots 1,2,4,8] [--rounds N] [--part slots,sampler,ray]
        [--model tiny] [--devices cpu:8] [--generate-rounds N] [--slots-model tiny|HIDDEN:LAYERS]

Two backends on this machine, one with `--adapter-host`, one with `--isolation-per-job` (no warm spares, so
each tree is the backend and what serves its jobs). For N = 1, 2, 4, 8 training jobs of the tiny model
(each after one forward_backward + step, so its optimizer state exists; `--slots-model 576:10` uses a
random Llama of that width and depth instead, about 77M parameters with its 32k vocabulary):
- PSS of each backend's process tree, over the same tree with one job (PSS: a shared page counts once);
- the bytes the host reports per slot against the growth measured;
- aggregate steps/s of N jobs stepping at once (each round: every job's forward_backward then step,
  pipelined), adapter host over N separate processes.

`--part sampler`: one job with a training and a sampling sub-job (the trainer one step in, synced to the
sampler), hosted (one process; the sampler's LoRA unmerged over the shared base) and unhosted (two
processes; the sampler's LoRA merged into its own base), both backends up at once:
- USS (pages only the tree holds) and PSS of each backend's tree, hosted over unhosted;
- greedy generate time on the sampling sub-job (the engine's own time, and the request's wall time, the
  median of `--generate-rounds`, the two backends' calls interleaved), hosted-unmerged over unhosted-merged.

`--part ray`: the same N jobs on the Ray executor (a one-node cluster on this machine), an adapter-host actor
against an actor per job: the PSS of the actors' processes (the host actor's, or every job's actor's; Ray's
own daemons are left out), over the same with one job, and aggregate steps/s host over per-actor.

Figures of one run (shared 2-core machine, one torch thread per worker), in docs/api.md ("Adapter host").
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cortex_nb import Client  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402


def tree_pss_bytes(pid: int) -> int:
    root = psutil.Process(pid)
    return pss_bytes([root, *root.children(recursive=True)])


def pss_bytes(processes: list[psutil.Process]) -> int:
    total = 0
    for process in processes:
        try:
            text = Path(f"/proc/{process.pid}/smaps_rollup").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += next(int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("Pss:"))
    return total


def batch(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 256, size=(4, 65))
    return {
        "input_ids": tokens[:, :-1],
        "target_tokens": tokens[:, 1:],
        "weights": np.ones((4, 64), np.float32),
    }


def train_round(jobs: list) -> None:
    pending = [job.forward_backward(batch(index)) for index, job in enumerate(jobs)]
    steps = [job.step() for job in jobs]
    for future in pending + steps:
        future.result()


def measure(
    client: Client, memory: Callable[[list], int], counts: list[int], rounds: int, model: str = "tiny"
) -> dict[int, tuple[int, float, int]]:
    """count -> (bytes `memory(jobs)` measures, aggregate steps/s, bytes the slots report)."""
    jobs: list = []
    figures = {}
    try:
        for count in counts:
            while len(jobs) < count:
                jobs.append(client.create_training_job(model, lora={"r": 16, "alpha": 32}, seed=len(jobs)))
            train_round(jobs)  # every job has its optimizer state
            pss = memory(jobs)
            started = time.perf_counter()
            for _ in range(rounds):
                train_round(jobs)
            speed = rounds * len(jobs) / (time.perf_counter() - started)
            reported = sum(
                int((client.get_job(job.job_id)["sub_jobs"][0].get("info") or {}).get("slot_bytes") or 0)
                for job in jobs
            )
            figures[count] = (pss, speed, reported)
    finally:
        for job in jobs:
            job.cancel()
    return figures


def tree_private_bytes(pid: int) -> int:
    """USS of a process and its descendants: the pages only they hold (heap, tensors), so processes outside
    the tree that map the same libraries do not shift it, as they shift PSS."""
    total = 0
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            text = Path(f"/proc/{process.pid}/smaps_rollup").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += sum(int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("Private_"))
    return total


GREEDY = {"max_tokens": 64, "temperature": 0.0, "ignore_eos": True}
PROMPTS = [list(range(3 + index, 19 + index)) for index in range(8)]


def sampler_job(client: Client, model: str):
    """A trainer one step in, synced to its sampler, which has generated once (warm)."""
    from cortex_nb.training import TrainingJob

    job = TrainingJob.create(client, model, lora={"r": 16, "alpha": 32}, samplers=1, seed=0)
    [sampler] = job.sub_jobs("sampling")
    vocab = next(m for m in client.list_models() if m["name"] == model)["vocab_size"]
    tokens = np.random.default_rng(0).integers(0, min(vocab, 256), size=(4, 65))
    job.forward_backward(
        {"input_ids": tokens[:, :-1], "target_tokens": tokens[:, 1:], "weights": np.ones((4, 64), np.float32)}
    ).result()
    job.step().result()
    job.sync_sampler().result()
    job.generate(PROMPTS, sub_job=sampler, **GREEDY).result()
    return job, sampler


def timed_generate(job, sampler: str) -> tuple[float, float, list[list[int]]]:
    """(engine seconds, request wall seconds, tokens) of one greedy generate on the sampler."""
    started = time.perf_counter()
    result = job.generate(PROMPTS, sub_job=sampler, **GREEDY).result()
    wall = time.perf_counter() - started
    return result.raw["generated_tokens"] / result.raw["tokens_per_second"], wall, result.tokens


def bench_sampler(model: str, devices: str, rounds: int) -> None:
    """Both backends up at once, their generates interleaved (so load on the machine hits both alike)."""
    common = ("--devices", devices, "--warm-workers", "0")
    if devices.startswith("cpu"):
        common += ("--worker-threads", "1")
    modes = ("--adapter-host", "--isolation-per-job")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        backends, jobs, memory, described = {}, {}, {}, {}
        for mode in modes:
            backend = start_backend(Path(tmp) / mode.strip("-"), *common, mode)
            stack.callback(backend.stop)
            client = stack.enter_context(Client(backend.url, backend.token))
            job, sampler = sampler_job(client, model)
            stack.callback(job.cancel)
            backends[mode], jobs[mode] = backend, (job, sampler)
            info = next(sub for sub in job.refresh()["sub_jobs"] if sub["sub_job_id"] == sampler)["info"]
            described[mode] = info["sampler"]["lora"]
        for mode in modes:
            memory[mode] = (tree_private_bytes(backends[mode].pid), tree_pss_bytes(backends[mode].pid))
        engine: dict[str, list[float]] = {mode: [] for mode in modes}
        wall: dict[str, list[float]] = {mode: [] for mode in modes}
        tokens = {}
        for _ in range(rounds):
            for mode in modes:
                seconds, request_seconds, tokens[mode] = timed_generate(*jobs[mode])
                engine[mode].append(seconds)
                wall[mode].append(request_seconds)
    host, alone = modes
    (uss, pss), (uss_alone, pss_alone) = memory[host], memory[alone]
    print(f"1 training + 1 sampling sub-job of {model} on {devices}, {rounds} interleaved generates each:")
    print(f"  sampler LoRA: hosted {described[host]}, unhosted {described[alone]}")
    print(f"  same greedy tokens hosted and unhosted: {tokens[host] == tokens[alone]}")
    print(
        f"  backend tree USS: hosted {uss / 2**20:.0f} MiB, unhosted {uss_alone / 2**20:.0f} MiB,"
        f" hosted/unhosted {uss / uss_alone:.2f}; PSS {pss / 2**20:.0f} vs {pss_alone / 2**20:.0f} MiB,"
        f" {pss / pss_alone:.2f}"
    )
    for label, figures in (("engine", engine), ("request wall", wall)):
        mine, theirs = statistics.median(figures[host]), statistics.median(figures[alone])
        print(
            f"  greedy generate (8 prompts x 64 tokens), {label} median: hosted {mine * 1000:.0f} ms,"
            f" unhosted {theirs * 1000:.0f} ms, hosted/unhosted {mine / theirs:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--part", default="slots,sampler")
    parser.add_argument("--model", default="tiny", help="the sampler part's base model")
    parser.add_argument("--devices", default=None, help="the sampler part's devices (default cpu:2)")
    parser.add_argument("--generate-rounds", type=int, default=7)
    parser.add_argument("--slots-model", default="tiny", help="the slots part's base: tiny, or HIDDEN:LAYERS")
    args = parser.parse_args()
    parts = set(args.part.split(","))
    if "slots" in parts:
        bench_slots([int(n) for n in args.slots.split(",")], args.rounds, args.slots_model)
    if "sampler" in parts:
        bench_sampler(args.model, args.devices or "cpu:2", args.generate_rounds)
    if "ray" in parts:
        bench_ray_slots([int(n) for n in args.slots.split(",")], args.rounds)


def bench_slots(counts: list[int], rounds: int, slots_model: str = "tiny") -> None:
    common = ("--devices", f"cpu:{max(counts)}", "--worker-threads", "1", "--warm-workers", "0")
    results = {}
    model = "tiny"
    with tempfile.TemporaryDirectory() as tmp:
        if slots_model != "tiny":
            from bench_bigger_bases import build_model_dir

            hidden, layers = (int(part) for part in slots_model.split(":"))
            model = "llama-random"
            common += ("--model", f"{model}={build_model_dir(Path(tmp) / 'llama', hidden, layers)}")
        for mode in ("--adapter-host", "--isolation-per-job"):
            backend = start_backend(Path(tmp) / mode.strip("-"), *common, mode)
            try:
                with Client(backend.url, backend.token) as client:
                    results[mode] = measure(
                        client, lambda _, pid=backend.pid: tree_pss_bytes(pid), counts, rounds, model
                    )
            finally:
                backend.stop()
    print_slots(counts, results)


def actor_pss_bytes(client: Client, jobs: list) -> int:
    """The PSS of the processes serving `jobs` on Ray: each job's actor, or the one host actor once."""
    pids = {int(client.get_job(job.job_id)["sub_jobs"][0]["info"]["pid"]) for job in jobs}
    hosts = client.get_capacity()["executor"].get("adapter_hosts") or []
    if hosts:
        pids = {int(host["pid"]) for host in hosts}
    return pss_bytes([psutil.Process(pid) for pid in pids])


def bench_ray_slots(counts: list[int], rounds: int) -> None:
    from tests.ray_cluster import start_ray_cluster

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("--adapter-host", "--isolation-per-job"):
            cluster = start_ray_cluster(Path(tmp) / mode.strip("-"), "--devices", f"cpu:{max(counts)}", mode)
            try:
                with cluster.client() as client:
                    results[mode] = measure(
                        client, lambda jobs, c=client: actor_pss_bytes(c, jobs), counts, rounds
                    )
            finally:
                cluster.stop()
    print("Ray executor (the PSS of the actors' processes):")
    print_slots(counts, results)


def print_slots(counts: list[int], results: dict[str, dict[int, tuple[int, float, int]]]) -> None:
    host, alone = results["--adapter-host"], results["--isolation-per-job"]
    one_host, one_alone = host[counts[0]][0], alone[counts[0]][0]
    print(
        f"{'N':>3} {'host PSS MiB':>13} {'/ N=1':>7} {'per-job PSS MiB':>16} {'/ N=1':>7} {'host/per-job':>13}"
        f" {'slot MiB rep.':>14} {'growth MiB':>11} {'steps/s host/per-job':>21}"
    )
    for count in counts:
        pss, speed, reported = host[count]
        pss_alone, speed_alone, _ = alone[count]
        print(
            f"{count:>3} {pss / 2**20:>13.0f} {pss / one_host:>7.2f} {pss_alone / 2**20:>16.0f}"
            f" {pss_alone / one_alone:>7.2f} {pss / pss_alone:>13.2f} {reported / 2**20:>14.1f}"
            f" {(pss - one_host) / 2**20:>11.0f} {speed / speed_alone:>21.2f}"
        )


if __name__ == "__main__":
    main()
