"""The built-in sampler: one prefill per prompt shared by its n samples, LoRA merged into a sampling
sub-job's weights, stops and logprobs, all pinned against transformers + peft in-process."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from cortex_nb import Client

from .reference import ReferenceTrainer, random_batch, reference_base, reference_logprobs, reference_lora
from .test_generate import hf_greedy

MODEL = "small-gpt2"


class Pair:
    """A job with a trainer and a sampler, trained 3 steps and synced in full (the sampler holds exactly the
    trainer's adapter), and the same adapter trained in-process."""

    def __init__(self, client: Client, gpt2_dir) -> None:
        self.client = client
        vocab = next(m for m in client.list_models() if m["name"] == MODEL)["vocab_size"]
        self.job = client.create_training_job(
            MODEL, lora={"r": 4, "alpha": 8}, optimizer={"lr": 5e-2}, seed=2, samplers=1
        )
        self.trainer_id, self.sampler_id = self.job.sub_jobs("training")[0], self.job.sub_jobs("sampling")[0]
        self.reference = ReferenceTrainer(
            reference_lora(reference_base(MODEL, gpt2_dir), r=4, alpha=8, seed=2), lr=5e-2
        )
        rng = np.random.default_rng(4)
        for _ in range(3):
            batch = random_batch(rng, vocab, batch=2, length=16)
            self.job.forward_backward(batch)
            self.job.step()
            self.reference.train_step(batch)
        self.job.sync_sampler(weight_format="full").result()
        self.reference.model.eval()
        self.prompts = [rng.integers(0, vocab, size=n).tolist() for n in (3, 11, 6, 1)]


@pytest.fixture(scope="module")
def pair(backend, gpt2_dir):
    with Client(backend.url, backend.token) as client:
        pair = Pair(client, gpt2_dir)
        yield pair
        pair.job.cancel()


def test_shared_prefill_and_merged_lora_equal_transformers_greedy(pair):
    """n greedy samples per prompt from one shared prefill, on the sampler (LoRA merged into its own
    weights) and on the trainer (unmerged), all equal transformers' generate on the peft model."""
    job, prompts = pair.job, pair.prompts
    from_sampler = job.generate(
        prompts, max_tokens=20, temperature=0.0, n=3, logprobs=True, sub_job=pair.sampler_id
    ).result()
    from_trainer = job.generate(
        prompts, max_tokens=20, temperature=0.0, n=2, sub_job=pair.trainer_id
    ).result()
    for result, n in ((from_sampler, 3), (from_trainer, 2)):
        assert result.weight_version == 3 and result.sampler == "transformers"
        assert [(s["prompt_index"], s["sample_index"]) for s in result.samples] == [
            (p, i) for p in range(4) for i in range(n)
        ]
        for sample in result.samples:
            expected = hf_greedy(pair.reference.model, prompts[sample["prompt_index"]], 20)
            assert sample["tokens"] == expected[: len(sample["tokens"])]
            if sample["finish_reason"] == "length":
                assert sample["tokens"] == expected
    # The sampler's merged weights give the trainer's logprobs for the same tokens.
    for sample in from_sampler.samples[::3]:
        prompt = prompts[sample["prompt_index"]]
        scored = job.compute_logprobs([prompt + sample["tokens"]], sub_job=pair.trainer_id).result()[0]
        np.testing.assert_allclose(sample["logprobs"], scored[len(prompt) - 1 :], atol=1e-4)


def test_logprobs_are_the_models_own_whatever_the_sampling(pair):
    """Sampled at temperature 0.7 with top-k and top-p, the reported logprobs of the sampled tokens and of the
    prompt are still those of the untruncated, temperature-1 distribution: the trainer's forward ones."""
    prompt = pair.client.tokenize(MODEL, ["the quick brown fox"])[0]
    result = pair.job.generate(
        [prompt],
        max_tokens=16,
        temperature=0.7,
        top_k=20,
        top_p=0.9,
        n=2,
        seed=3,
        logprobs=True,
        prompt_logprobs=True,
        ignore_eos=True,
        sub_job=pair.sampler_id,
    ).result()
    for sample in result.samples:
        sequence = prompt + sample["tokens"]
        batch = {"input_ids": np.array([sequence[:-1]]), "target_tokens": np.array([sequence[1:]])}
        with torch.no_grad():
            expected = reference_logprobs(pair.reference.model, batch).numpy()[0]
        np.testing.assert_allclose(sample["logprobs"], expected[len(prompt) - 1 :], atol=1e-4)
        assert sample["logprob"] == pytest.approx(sum(sample["logprobs"]), abs=1e-4)
    np.testing.assert_allclose(result.prompt_logprobs[0], expected[: len(prompt) - 1], atol=1e-4)


def test_stop_strings_and_ids_end_samples_at_the_same_token(pair):
    """A stop string ends a sample at the token whose text completes it (the text cut before it); a stop
    token id ends it at that token (kept in tokens, left out of the text); n samples stop independently."""

    def generate(**params):
        return pair.job.generate(
            ["the quick brown"],
            sub_job=pair.sampler_id,
            max_tokens=24,
            temperature=0.0,
            ignore_eos=True,
            **params,
        ).result()

    def detokenize(ids):
        return pair.client.detokenize(MODEL, [ids])[0]

    free = generate().samples[0]
    text, tokens = free["text"], free["tokens"]
    stop = text[6:9]
    assert len(stop) == 3 and stop in text, f"greedy text too short to pick a stop string from: {text!r}"
    for sample in generate(stop=[stop], n=2).samples:
        assert sample["finish_reason"] == "stop"
        assert sample["text"] == text[: text.find(stop)]
        # the kept tokens are the shortest prefix of the free run whose text holds the stop string
        assert sample["tokens"] == tokens[: len(sample["tokens"])]
        assert stop in detokenize(sample["tokens"]) and stop not in detokenize(sample["tokens"][:-1])
    stop_id = tokens[7]
    by_id = generate(stop=[stop_id]).samples[0]
    first = tokens.index(stop_id)
    assert by_id["tokens"] == tokens[: first + 1] and by_id["finish_reason"] == "stop"
    assert by_id["text"] == detokenize(tokens[:first])


def test_capacity_sub_jobs_and_results_name_the_sampler(pair):
    assert {device["sampler"] for device in pair.client.get_capacity()["devices"]} == {"transformers"}
    subs = {sub["sub_job_id"]: sub for sub in pair.job.refresh()["sub_jobs"]}
    assert subs[pair.sampler_id]["info"]["sampler"] == {"engine": "transformers", "lora": "merged"}
    assert subs[pair.trainer_id]["info"]["sampler"] == {"engine": "transformers", "lora": "unmerged"}
    result = pair.job.generate(["abc"], max_tokens=2, temperature=0.0).result()
    assert result.sampler == "transformers" and repr(result).endswith("sampler transformers>")


def test_sampler_vllm_is_refused_where_vllm_is_missing(tmp_path):
    """`--sampler vllm` on a Python without vLLM fails at start with what to install, not at the first sample."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this Python (tests/test_vllm_sampler.py covers it)")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cortex_backend",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path),
            "--sampler",
            "vllm",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "cortex-nb[vllm]" in done.stderr


def test_base_model_sampler_shares_a_prefill_and_equals_transformers_greedy(backend, gpt2_dir):
    """Without LoRA training (a fresh adapter is the identity), n greedy samples per prompt from one shared
    prefill equal transformers' `generate` on the bare base model, no peft involved."""
    prompts = [[5, 17, 230, 9], [44], [7, 7, 7, 301, 12, 3, 88]]
    with Client(backend.url, backend.token) as client:
        sampler = client.create_sampler(MODEL)
        try:
            result = sampler.generate(prompts, max_tokens=16, temperature=0.0, n=3).result()
        finally:
            sampler.cancel()
    base = reference_base(MODEL, gpt2_dir).eval()
    assert result.sampler == "transformers" and len(result.samples) == 9
    for sample in result.samples:
        expected = hf_greedy(base, prompts[sample["prompt_index"]], 16)
        assert sample["tokens"] == expected[: len(sample["tokens"])]
        if sample["finish_reason"] == "length":
            assert sample["tokens"] == expected
