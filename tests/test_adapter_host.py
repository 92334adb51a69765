"""The adapter host: sub-jobs on one device and base are slots of one process holding the base once.

Each slot's numerics equal the same job alone (on the session backend, a process per sub-job) bitwise on
CPU fp32, whatever its neighbours do; a NaN in one slot fails that slot's step, not its neighbours'; the
backend's process tree with 8 slots holds little more memory than with one (PSS, so shared pages count once);
and a job's samplers are slots too, sampling its trained adapter unmerged, never writing to the shared base.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psutil
import pytest

from cortex_nb import Client
from cortex_nb.api import api_of
from cortex_nb.errors import CortexError
from cortex_nb.training import TrainingJob
from cortex_nb.views import adapter_host_lines

from .backend_process import start_backend
from .reference import ReferenceTrainer, random_batch, reference_base, reference_lora
from .test_sampler_paths import PROMPTS, forward_logprobs, hf_greedy

VOCAB = 259
STEPS = 3
NAN_JOB = "job-nan-slot"
# (rank, alpha, learning rate, target modules, LoRA dropout): slots that differ in every setting a slot
# owns; dropout draws from the process RNG, so two slots with dropout show that each keeps its own RNG.
SLOTS = [
    (4, 8, 1e-2, "all-linear", 0.1),
    (8, 16, 5e-3, "all-linear", 0.0),
    (16, 32, 2e-2, ["q_proj", "v_proj"], 0.0),
    (2, 4, 1e-3, "all-linear", 0.2),
]


@pytest.fixture(scope="module")
def host_backend(tmp_path_factory):
    """Adapter-host mode, no warm spare (so the process tree is the backend and its hosts alone)."""
    process = start_backend(
        tmp_path_factory.mktemp("adapter-host"),
        "--adapter-host",
        "--devices",
        "cpu:8",
        "--worker-threads",
        "1",
        "--warm-workers",
        "0",
        "--fault-injection",
        f"nan_loss={NAN_JOB}",
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def host_client(host_backend) -> Client:
    with Client(host_backend.url, host_backend.token) as client:
        yield client


def batches(seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [random_batch(rng, VOCAB, batch=2, length=12) for _ in range(STEPS)]


def create(client: Client, slot: tuple, seed: int, job_id: str | None = None):
    r, alpha, lr, targets, dropout = slot
    return client.create_training_job(
        "tiny",
        lora={"r": r, "alpha": alpha, "target_modules": targets, "dropout": dropout},
        optimizer={"lr": lr},
        seed=seed,
        job_id=job_id,
    )


def train_alone(client: Client, slot: tuple, seed: int) -> list[tuple]:
    job = create(client, slot, seed)
    try:
        out = []
        for batch in batches(seed):
            result = job.forward_backward(batch).result()
            step = job.step().result()
            out.append((result["loss"], result["tensors"]["logprobs"], step["grad_norm"]))
        return out
    finally:
        job.cancel()


def tree_pss_bytes(pid: int) -> int:
    """PSS of a process and its descendants: each shared page counted once, split among its sharers."""
    total = 0
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            text = Path(f"/proc/{process.pid}/smaps_rollup").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += next(int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("Pss:"))
    return total


def test_slots_equal_the_same_jobs_alone_bitwise(host_client: Client, client: Client):
    jobs = [create(host_client, slot, seed=10 + index) for index, slot in enumerate(SLOTS)]
    try:
        results: list[list[tuple]] = [[] for _ in SLOTS]
        for step in range(STEPS):
            # Interleaved: every slot's forward_backward queued before any slot's step.
            pending = [job.forward_backward(batches(10 + index)[step]) for index, job in enumerate(jobs)]
            steps = [job.step() for job in jobs]
            for index, (fb, st) in enumerate(zip(pending, steps, strict=True)):
                result = fb.result()
                results[index].append(
                    (result["loss"], result["tensors"]["logprobs"], st.result()["grad_norm"])
                )
        # One process served them all, and says what the base and each slot hold.
        infos = [host_client.get_job(job.job_id)["sub_jobs"][0]["info"] for job in jobs]
        assert len({info["pid"] for info in infos}) == 1
        assert all(info["adapter_host"]["base_bytes"] > 0 for info in infos)
        for info in infos:
            assert info["slot_bytes"] == 4 * info["adapter_bytes"] > 0
        assert len({info["adapter_bytes"] for info in infos}) == len(SLOTS)  # ranks and targets differ
        capacity = host_client.get_capacity()["executor"]
        assert capacity["hosting"] == "adapter_host"
        [host] = capacity["adapter_hosts"]
        assert host["slots"] == len(SLOTS) and host["base_model"] == "tiny"
        assert host["slots_bytes"] == sum(info["slot_bytes"] for info in infos)
        # `%cortex capacity` (and the sidebar) say it in words.
        [line] = adapter_host_lines(host_client.get_capacity())
        assert line.startswith(f"adapter host {host['device']} · tiny: {len(SLOTS)} slot(s) on one base")
    finally:
        for job in jobs:
            job.cancel()
    for index, slot in enumerate(SLOTS):
        alone = train_alone(client, slot, seed=10 + index)
        for (loss, logprobs, grad_norm), (loss_alone, logprobs_alone, grad_norm_alone) in zip(
            results[index], alone, strict=True
        ):
            assert loss == loss_alone and grad_norm == grad_norm_alone, f"slot {index}"
            assert np.array_equal(logprobs, logprobs_alone), f"slot {index}"
        # And each without dropout equals in-process peft (an independent implementation, so to rounding).
        r, alpha, lr, targets, dropout = slot
        if dropout:
            continue
        reference = ReferenceTrainer(
            reference_lora(reference_base("tiny"), r=r, alpha=alpha, seed=10 + index, target_modules=targets),
            lr=lr,
        )
        for step, batch in enumerate(batches(10 + index)):
            expected, _ = reference.train_step(batch)
            assert results[index][step][0] == pytest.approx(expected, rel=1e-5, abs=1e-5), f"slot {index}"


def test_a_nan_in_one_slot_leaves_its_neighbour_unchanged(host_client: Client, client: Client):
    slot = SLOTS[1]
    poisoned = create(host_client, slot, seed=7, job_id=NAN_JOB)
    neighbour = create(host_client, slot, seed=8)
    try:
        neighbour_results = []
        for batch, poison in zip(batches(8), batches(7), strict=True):
            poisoned.forward_backward(poison)
            fb = neighbour.forward_backward(batch)
            bad_step = poisoned.step()
            step = neighbour.step()
            with pytest.raises(CortexError) as refused:
                bad_step.result()
            assert refused.value.code == "non_finite_gradients"
            result = fb.result()
            neighbour_results.append(
                (result["loss"], result["tensors"]["logprobs"], step.result()["grad_norm"])
            )
        # The poisoned slot still serves (its failures were per request): a forward answers.
        assert poisoned.forward(batches(7)[0]).result()["tensors"]["logprobs"].shape == (2, 12)
    finally:
        poisoned.cancel()
        neighbour.cancel()
    alone = train_alone(client, slot, seed=8)
    for (loss, logprobs, grad_norm), (loss_alone, logprobs_alone, grad_norm_alone) in zip(
        neighbour_results, alone, strict=True
    ):
        assert loss == loss_alone and grad_norm == grad_norm_alone
        assert np.array_equal(logprobs, logprobs_alone)


def test_eight_slots_hold_little_more_memory_than_one(host_client: Client, host_backend):
    batch = batches(1)[0]
    jobs = []
    try:
        jobs.append(create(host_client, SLOTS[0], seed=1))
        jobs[0].forward_backward(batch).result()
        jobs[0].step().result()  # the optimizer's moments exist now
        one = tree_pss_bytes(host_backend.pid)
        for seed in range(2, 9):
            jobs.append(create(host_client, SLOTS[seed % len(SLOTS)], seed=seed))
        for job in jobs[1:]:
            job.forward_backward(batch)
            job.step().result()
        eight = tree_pss_bytes(host_backend.pid)
        assert len(host_client.get_capacity()["executor"]["adapter_hosts"]) == 1
        print(f"backend tree PSS: 1 slot {one / 2**20:.0f} MiB, 8 slots {eight / 2**20:.0f} MiB")
        assert eight <= 1.3 * one, f"8 slots {eight / 2**20:.0f} MiB vs 1 slot {one / 2**20:.0f} MiB"
    finally:
        for job in jobs:
            job.cancel()


def test_a_backend_with_slots_stops_cleanly_on_sigterm(tmp_path):
    """The drain stops every slot and then its host (one process, stopped once), and the backend exits 0."""
    import signal

    backend = start_backend(tmp_path / "data", "--adapter-host", "--devices", "cpu:2", "--warm-workers", "0")
    try:
        with Client(backend.url, backend.token) as client:
            jobs = [create(client, SLOTS[index], seed=index) for index in range(2)]
            for job in jobs:
                job.forward_backward(batches(1)[0]).result()
            [host_pid] = {client.get_job(job.job_id)["sub_jobs"][0]["info"]["pid"] for job in jobs}
        backend.process.send_signal(signal.SIGTERM)
        assert backend.process.wait(60) == 0
        assert not psutil.pid_exists(host_pid)
    finally:
        backend.stop()


GREEDY = {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True, "logprobs": True}


def greedy_matches(reference, samples: list[dict]) -> None:
    """Each greedy sample is transformers' generate on the reference peft model, its logprobs a forward
    pass's."""
    for sample in samples:
        prompt = PROMPTS[sample["prompt_index"]]
        assert sample["tokens"] == hf_greedy(reference, prompt, GREEDY["max_tokens"])
        assert sample["logprobs"] == pytest.approx(
            forward_logprobs(reference, prompt, sample["tokens"]), abs=1e-4
        )


def test_a_jobs_samplers_are_slots_that_sample_its_adapter_unmerged_and_leave_the_base(
    host_client: Client, client: Client, host_backend
):
    """Training, sampling and log-probability sub-jobs of one job, and a neighbour's training job, in one host
    process. The sampler samples the trainer's adapter after a weight sync, as transformers' generate on the
    same peft model does; the neighbour's results equal its job alone bitwise; a new sampler of the bare base
    samples what the pristine base does: nothing wrote to the shared base."""
    lora = {"r": 4, "alpha": 8}
    sub_jobs = [
        {"type": "training", "base_model": "tiny", "lora": lora, "optimizer": {"lr": 5e-2}, "seed": 3},
        {"type": "sampling", "base_model": "tiny", "lora": lora, "seed": 3},
        {"type": "log_probability", "base_model": "tiny", "lora": lora, "seed": 3},
    ]
    job = TrainingJob(host_client, api_of(host_client).create_job(sub_jobs))
    job.wait_ready()
    [sampler], [scorer] = job.sub_jobs("sampling"), job.sub_jobs("log_probability")
    neighbour = create(host_client, SLOTS[1], seed=8)
    reference = ReferenceTrainer(reference_lora(reference_base("tiny"), r=4, alpha=8, seed=3), lr=5e-2)
    fresh = None
    try:
        # The sampler's adapter is fresh (the identity) until a sync.
        greedy_matches(reference.model, job.generate(PROMPTS, sub_job=sampler, **GREEDY).result().samples)
        neighbour_results = []
        for batch, neighbour_batch in zip(batches(3), batches(8), strict=True):
            pending = (job.forward_backward(batch), job.step())
            neighbour_pending = (neighbour.forward_backward(neighbour_batch), neighbour.step())
            between = job.generate(PROMPTS, sub_job=sampler, **GREEDY)  # sampled among the others' steps
            for future in pending:
                future.result()
            result = neighbour_pending[0].result()
            neighbour_results.append(
                (result["loss"], result["tensors"]["logprobs"], neighbour_pending[1].result()["grad_norm"])
            )
            between.result()
            reference.train_step(batch)
        # A sync as deltas (fp16, so the adapter to fp16's precision): greedy tokens as the reference's.
        sync = job.sync_sampler(targets=[sampler, scorer]).result()
        assert sync["weight_version"] == STEPS
        delta = job.generate(PROMPTS, sub_job=sampler, **GREEDY).result()
        assert delta.weight_version == STEPS
        for sample in delta.samples:
            assert sample["tokens"] == hf_greedy(reference.model, PROMPTS[sample["prompt_index"]], 12)
        # The exact tensors: tokens and logprobs as the reference's.
        job.sync_sampler(targets=[sampler, scorer], weight_format="full").result()
        after = job.generate(PROMPTS, sub_job=sampler, **GREEDY).result()
        greedy_matches(reference.model, after.samples)
        # The log-probability slot scores with the synced adapter too.
        sequences = [PROMPTS[sample["prompt_index"]] + sample["tokens"] for sample in after.samples]
        scored = job.compute_logprobs(sequences, sub_job=scorer).result()
        for sequence, values in zip(sequences, scored, strict=True):
            expected = forward_logprobs(reference.model, sequence[:1], sequence[1:])
            np.testing.assert_allclose(values, expected, rtol=0, atol=1e-5)

        # A new sampler of the bare base (a fresh adapter adds nothing) on the same host samples the
        # pristine base's greedy tokens.
        fresh = host_client.create_sampler("tiny", lora=lora, seed=5)
        bare = reference_lora(reference_base("tiny"), r=4, alpha=8, seed=5).eval()
        greedy_matches(bare, fresh.generate(PROMPTS, **GREEDY).result().samples)

        # One process for the base; a sampler's slot costs its adapter's bytes, not a base.
        infos = {sub["sub_job_id"]: sub["info"] for sub in host_client.get_job(job.job_id)["sub_jobs"]}
        infos["neighbour"] = host_client.get_job(neighbour.job_id)["sub_jobs"][0]["info"]
        infos["fresh"] = host_client.get_job(fresh.job_id)["sub_jobs"][0]["info"]
        [host_pid] = {info["pid"] for info in infos.values()}
        # ... and no other worker process: the job's sub-jobs, started together, started one host, not a
        # host and a spare (a former test's host may still be exiting).
        # (CPU workers are forks of the fork server, which itself stays.)
        fork_server = (host_client.get_capacity()["executor"].get("fork_server") or {}).get("pid")
        others = [
            child
            for child in psutil.Process(host_backend.pid).children(recursive=True)
            if child.pid not in (host_pid, fork_server)
        ]
        _, alive = psutil.wait_procs(others, timeout=30)
        assert not alive, [process.cmdline() for process in alive]
        assert infos[sampler]["sampler"] == {"engine": "transformers", "lora": "unmerged"}
        [trainer] = job.sub_jobs("training")
        assert infos[trainer]["slot_bytes"] == 4 * infos[trainer]["adapter_bytes"]
        base_bytes = infos[sampler]["adapter_host"]["base_bytes"]
        for name in (sampler, scorer, "fresh"):
            info = infos[name]
            assert info["gradient_bytes"] == info["optimizer_bytes"] == 0
            assert info["slot_bytes"] == info["adapter_bytes"] == infos[trainer]["adapter_bytes"]
            assert info["slot_bytes"] * 10 < base_bytes
        [host] = host_client.get_capacity()["executor"]["adapter_hosts"]
        assert host["slots"] == 5
        assert host["slots_bytes"] == sum(info["slot_bytes"] for info in infos.values())
        print(
            f"base {base_bytes / 2**20:.1f} MiB held once;"
            f" sampler slot {infos[sampler]['slot_bytes'] / 2**10:.0f} KiB,"
            f" training slot {infos[trainer]['slot_bytes'] / 2**10:.0f} KiB"
        )
    finally:
        for handle in (job, neighbour, fresh):
            if handle is not None:
                handle.cancel()
    alone = train_alone(client, SLOTS[1], seed=8)
    for (loss, logprobs, grad_norm), (loss_alone, logprobs_alone, grad_norm_alone) in zip(
        neighbour_results, alone, strict=True
    ):
        assert loss == loss_alone and grad_norm == grad_norm_alone
        assert np.array_equal(logprobs, logprobs_alone)
