"""vLLM sampling slots of an adapter host share the host's one vLLM engine (engine/hosted_vllm.py).

A real backend (`--adapter-host --sampler vllm`, from the vLLM venv as in test_vllm_sampler.py) holds two
tenants' jobs, each a trainer and a vLLM sampler, in one process: their samplers register their adapters
as LoRAs of one engine, whose steps decode both tenants' requests at once, each row through its own
tenant's adapter. References are transformers + peft in this Python, trained step for step.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cortex_nb import Client
from cortex_nb.errors import RequestFailed
from cortex_nb.polling import poll_request
from cortex_nb.training import TrainingJob
from cortex_nb.views import VLLM_HOST_WORDS, adapter_host_lines

from .backend_process import start_backend
from .notebook_fixtures import wait_until
from .reference import ReferenceTrainer, random_batch, reference_base, reference_logprobs, reference_lora
from .test_generate import hf_greedy
from .test_vllm_sampler import MODEL, PROMPTS_TEXT, _assert_greedy_equal, vllm_python

MAX_LORA_RANK = 16
GREEDY = {"max_tokens": 24, "temperature": 0.0}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    from .model_factory import build_llama_dir

    return build_llama_dir(tmp_path_factory.mktemp("models") / MODEL)


@pytest.fixture(scope="module")
def host_client(tmp_path_factory, llama_dir):
    backend = start_backend(
        tmp_path_factory.mktemp("vllm-host"),
        "--model",
        f"{MODEL}={llama_dir}",
        "--adapter-host",
        "--devices",
        "cpu:2",
        "--sampler",
        "vllm",
        "--vllm-max-lora-rank",
        str(MAX_LORA_RANK),
        "--worker-threads",
        "1",
        "--warm-workers",
        "0",
        python=vllm_python(),
        timeout_s=180,
    )
    try:
        with Client(backend.url, backend.token) as client:
            yield client
    finally:
        backend.stop()


class Tenant:
    """One tenant's job on the host (a trainer and a vLLM sampler) and its adapter trained in-process."""

    def __init__(self, client: Client, llama_dir: Path, rank: int, lr: float, seed: int) -> None:
        self.client = client
        self.lora = {"r": rank, "alpha": 16}
        self.job = TrainingJob.create(
            client, MODEL, lora=self.lora, optimizer={"lr": lr}, samplers=1, seed=seed
        )
        self.trainer_id = self.job.sub_jobs("training")[0]
        self.sampler_id = self.job.sub_jobs("sampling")[0]
        self.reference = ReferenceTrainer(
            reference_lora(reference_base(MODEL, llama_dir), seed=seed, **self.lora), lr=lr
        )
        self.vocab = next(m for m in client.list_models() if m["name"] == MODEL)["vocab_size"]
        self.rng = np.random.default_rng(seed)
        self.prompts = client.tokenize(MODEL, PROMPTS_TEXT)

    def train_and_sync(self, steps: int) -> None:
        for _ in range(steps):
            batch = random_batch(self.rng, self.vocab, batch=2, length=16)
            loss = self.job.forward_backward(batch).result()["loss"]
            self.job.step()
            # the trainer slot beside the engine trains as in-process peft does
            assert loss == pytest.approx(self.reference.train_step(batch)[0], rel=1e-5)
        self.reference.model.eval()
        self.job.sync_sampler(weight_format="full").result()  # exactly the trainer's adapter (a delta rounds)

    def generate(self, **sampling):
        return self.job.generate(self.prompts, sub_job=self.sampler_id, **{**GREEDY, **sampling})

    def reference_greedy(self) -> list[list[int]]:
        return [hf_greedy(self.reference.model, prompt, GREEDY["max_tokens"]) for prompt in self.prompts]

    def reference_logprobs(self, sequence: list[int]) -> np.ndarray:
        """Each token's logprob after the first under the in-process adapter."""
        batch = {"input_ids": np.array([sequence[:-1]]), "target_tokens": np.array([sequence[1:]])}
        with torch.no_grad():
            return reference_logprobs(self.reference.model, batch).numpy()[0]

    def sub_jobs(self) -> dict[str, dict]:
        return {sub["sub_job_id"]: sub for sub in self.job.refresh()["sub_jobs"]}

    def sampler_lines(self, marker: str, sub_job: str | None = None) -> list[str]:
        lines, cursor = [], 0
        while True:
            page = self.client.tail_logs(self.job.job_id, cursor=cursor, sub_job=sub_job or self.sampler_id)
            lines += [line["line"] for line in page["lines"] if marker in line["line"]]
            if not page["lines"]:
                return lines
            cursor = page["cursor"]


@pytest.fixture(scope="module")
def tenants(host_client, llama_dir):
    first = Tenant(host_client, llama_dir, rank=8, lr=3e-2, seed=2)
    second = Tenant(host_client, llama_dir, rank=16, lr=2e-2, seed=3)
    first.train_and_sync(2)
    second.train_and_sync(3)
    yield first, second
    first.job.cancel()
    second.job.cancel()


def turn_held(tenant: Tenant):
    """A long built-in generate on `tenant`'s trainer holds the host's turn (cancelled by the caller)."""
    blocker = tenant.job.generate(
        [tenant.prompts[0]] * 64, sub_job=tenant.trainer_id, max_tokens=480, temperature=0.0, ignore_eos=True
    )
    wait_until(lambda: blocker.status()["status"] == "running", 60)
    return blocker


def assert_cancelled(future) -> None:
    with pytest.raises(RequestFailed) as failed:
        future.result()
    assert failed.value.code == "cancelled"


def test_sampling_slots_register_their_adapters_in_the_hosts_one_engine(host_client, tenants):
    subs = [sub for tenant in tenants for sub in tenant.sub_jobs().values()]
    assert len({sub["info"]["adapter_host"]["pid"] for sub in subs}) == 1  # four slots, one process
    for tenant in tenants:
        sampler = tenant.sub_jobs()[tenant.sampler_id]["info"]["sampler"]
        assert sampler["engine"] == "vllm" and sampler["shared_engine"] is True
        assert sampler["max_lora_rank"] == MAX_LORA_RANK
    # each tenant's LoRA ids are its own, and its log lists only its own
    first_ids, second_ids = (
        {tenant.sub_jobs()[tenant.sampler_id]["info"]["sampler"]["lora_id"]} for tenant in tenants
    )
    assert first_ids.isdisjoint(second_ids)
    [host] = host_client.get_capacity()["executor"]["adapter_hosts"]
    assert host["slots"] == 4 and host["base_model"] == MODEL
    assert host["base_bytes"] >= 2**30  # the engine's KV cache (--vllm-cpu-kv-cache-gib 1) is held once
    [line] = adapter_host_lines(host_client.get_capacity())  # %cortex capacity's and the sidebar's words
    assert line.startswith(f"adapter host cpu · {MODEL}: 4 slot(s) on one base") and line.endswith(
        VLLM_HOST_WORDS
    )


def test_two_tenants_generates_share_engine_steps_each_through_its_own_adapter(tenants):
    first, second = tenants
    blocker = turn_held(first)
    # the first also scores its prompts: its slot takes the turn again after the engine's steps
    together = [first.generate(logprobs=True, prompt_logprobs=True), second.generate(logprobs=True)]
    time.sleep(1.0)  # both samplers are waiting for the turn, their requests about to enter the engine
    blocker.cancel()
    assert_cancelled(blocker)  # it held the turn all along
    for tenant, future in zip(tenants, together, strict=True):
        result = future.result()
        assert result.sampler == "vllm"
        _assert_greedy_equal(result.samples, tenant.reference_greedy())
        for sample in result.samples:  # each row's logprobs are its own adapter's (a forward in-process)
            prompt = tenant.prompts[sample["prompt_index"]]
            scored = tenant.reference_logprobs(prompt + sample["tokens"])
            np.testing.assert_allclose(sample["logprobs"], scored[len(prompt) - 1 :], atol=1e-4)
            if tenant is first:
                np.testing.assert_allclose(
                    result.prompt_logprobs[sample["prompt_index"]], scored[: len(prompt) - 1], atol=1e-4
                )
    # the adapters differ: each tenant got its own, not a neighbour's
    assert [s["tokens"] for s in together[0].result().samples] != [
        s["tokens"] for s in together[1].result().samples
    ]
    for tenant in tenants:
        wait_until(lambda tenant=tenant: tenant.sampler_lines("together with other slots' requests"), 30)
    # alone, each gets the same tokens
    for tenant, future in zip(tenants, together, strict=True):
        alone = tenant.generate().result()
        assert [s["tokens"] for s in alone.samples] == [s["tokens"] for s in future.result().samples]


def test_a_hot_swapped_adapter_serves_the_next_generate_and_the_neighbour_keeps_its_own(tenants):
    first, second = tenants
    before = second.generate().result()
    first.train_and_sync(1)
    wait_until(lambda: first.sampler_lines("v3 as LoRA id"), 30)
    _assert_greedy_equal(first.generate().result().samples, first.reference_greedy())
    after = second.generate().result()
    assert [s["tokens"] for s in after.samples] == [s["tokens"] for s in before.samples]
    assert after.weight_version == before.weight_version == 3


def test_a_streamed_client_that_leaves_is_aborted_in_the_shared_engine_and_the_neighbour_ends_whole(tenants):
    first, second = tenants
    blocker = turn_held(second)
    stream = first.job.generate_stream(
        [first.prompts[0]], sub_job=first.sampler_id, max_tokens=400, temperature=0.0, ignore_eos=True
    )
    neighbour = second.generate()
    time.sleep(1.0)
    blocker.cancel()
    assert_cancelled(blocker)
    for _ in stream:
        break
    stream.close()
    with pytest.raises(RequestFailed) as failed:
        poll_request(first.job.api, first.job.job_id, stream.request_id, timeout_s=60)
    assert failed.value.code == "cancelled"
    _assert_greedy_equal(neighbour.result().samples, second.reference_greedy())
    wait_until(lambda: first.sampler_lines("vllm aborted 1 unfinished request(s)"), 30)
    # the engine holds nothing of it: the slot samples on, as its reference says
    _assert_greedy_equal(first.generate().result().samples, first.reference_greedy())


def test_a_rank_past_the_engines_samples_with_the_builtin_engine_and_leaving_frees_the_slots(
    host_client, llama_dir, tenants
):
    wide = Tenant(host_client, llama_dir, rank=32, lr=1e-2, seed=5)
    sampler = wide.sub_jobs()[wide.sampler_id]["info"]["sampler"]
    assert sampler["engine"] == "transformers"
    assert wide.sampler_lines(f"serves LoRA ranks up to {MAX_LORA_RANK}")
    # a slot opened after the engine still sets its own torch threads (vLLM's CPU worker would refuse it)
    assert wide.sampler_lines("ready:", wide.trainer_id)
    assert not wide.sampler_lines("set_num_threads", wide.trainer_id)
    wide.train_and_sync(1)
    _assert_greedy_equal(wide.generate().result().samples, wide.reference_greedy())
    wide.job.cancel()
    wait_until(lambda: host_client.get_capacity()["executor"]["adapter_hosts"][0]["slots"] == 4, 60)
    for tenant in tenants:  # the engine serves the others on
        _assert_greedy_equal(tenant.generate().result().samples, tenant.reference_greedy())
