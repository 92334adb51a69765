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


def _trained_pair(client: Client, model: str, gpt2_dir, vocab: int, steps: int = 3):
    """A job with a trainer and a sampler trained `steps` steps and synced, and the same adapter in-process."""
    job = client.create_training_job(
        model, lora={"r": 4, "alpha": 8}, optimizer={"lr": 5e-2}, seed=2, samplers=1
    )
    reference = ReferenceTrainer(
        reference_lora(reference_base(model, gpt2_dir), r=4, alpha=8, seed=2), lr=5e-2
    )
    rng = np.random.default_rng(4)
    for _ in range(steps):
        batch = random_batch(rng, vocab, batch=2, length=16)
        job.forward_backward(batch)
        job.step()
        reference.train_step(batch)
    job.sync_sampler(weight_format="full").result()  # fp32: the sampler holds exactly the trainer's adapter
    reference.model.eval()
    return job, reference


@pytest.mark.parametrize("model", ["tiny", "small-gpt2"])
def test_shared_prefill_and_merged_lora_equal_transformers_greedy(client: Client, gpt2_dir, model):
    """n greedy samples per prompt from one shared prefill, on the sampler (LoRA merged into its own
    weights) and on the trainer (unmerged), all equal transformers' generate on the peft model."""
    vocab = next(m for m in client.list_models() if m["name"] == model)["vocab_size"]
    job, reference = _trained_pair(client, model, gpt2_dir, vocab)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, vocab, size=n).tolist() for n in (3, 11, 6, 1)]
    try:
        sampler_id = job.sub_jobs("sampling")[0]
        from_sampler = job.generate(
            prompts, max_tokens=20, temperature=0.0, n=3, logprobs=True, sub_job=sampler_id
        ).result()
        from_trainer = job.generate(
            prompts, max_tokens=20, temperature=0.0, n=2, sub_job=job.sub_jobs("training")[0]
        ).result()
        for result, n in ((from_sampler, 3), (from_trainer, 2)):
            assert result.weight_version == 3 and result.raw["sampler"] == "transformers"
            assert [(s["prompt_index"], s["sample_index"]) for s in result.samples] == [
                (p, i) for p in range(4) for i in range(n)
            ]
            for sample in result.samples:
                expected = hf_greedy(reference.model, prompts[sample["prompt_index"]], 20)
                assert sample["tokens"] == expected[: len(sample["tokens"])]
                if sample["finish_reason"] == "length":
                    assert sample["tokens"] == expected
        # The sampler's merged weights give the trainer's logprobs for the same tokens.
        for sample in from_sampler.samples[::3]:
            prompt = prompts[sample["prompt_index"]]
            scored = job.compute_logprobs(
                [prompt + sample["tokens"]], sub_job=job.sub_jobs("training")[0]
            ).result()[0]
            np.testing.assert_allclose(sample["logprobs"], scored[len(prompt) - 1 :], atol=1e-4)
    finally:
        job.cancel()


def test_logprobs_are_the_models_own_whatever_the_sampling(client: Client, gpt2_dir):
    """Sampled at temperature 0.7 with top-k and top-p, the reported logprobs of the sampled tokens and of the
    prompt are still those of the untruncated, temperature-1 distribution: the trainer's forward ones."""
    vocab = next(m for m in client.list_models() if m["name"] == "small-gpt2")["vocab_size"]
    job, reference = _trained_pair(client, "small-gpt2", gpt2_dir, vocab, steps=2)
    try:
        prompt = client.tokenize("small-gpt2", ["the quick brown fox"])[0]
        result = job.generate(
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
        ).result()
        for sample in result.samples:
            sequence = prompt + sample["tokens"]
            batch = {"input_ids": np.array([sequence[:-1]]), "target_tokens": np.array([sequence[1:]])}
            with torch.no_grad():
                expected = reference_logprobs(reference.model, batch).numpy()[0]
            np.testing.assert_allclose(sample["logprobs"], expected[len(prompt) - 1 :], atol=1e-4)
            assert sample["logprob"] == pytest.approx(sum(sample["logprobs"]), abs=1e-4)
        np.testing.assert_allclose(result.raw["prompt_logprobs"][0], expected[: len(prompt) - 1], atol=1e-4)
    finally:
        job.cancel()


def test_stop_strings_and_ids_end_samples_at_the_same_token(client: Client):
    """A stop string ends a sample at the token whose text completes it (the text cut before it); a stop
    token id ends it at that token (kept in tokens, left out of the text); n samples stop independently."""
    sampler = client.create_sampler("small-gpt2")
    try:
        prompt = ["the quick brown"]
        free = sampler.generate(prompt, max_tokens=24, temperature=0.0, ignore_eos=True).result().samples[0]
        text, tokens = free["text"], free["tokens"]
        stop = text[6:9]
        assert len(stop) == 3 and stop in text, f"greedy text too short to pick a stop string from: {text!r}"
        cut = sampler.generate(
            prompt, max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop], n=2
        ).result()
        detok = lambda ids: client.detokenize("small-gpt2", [ids])[0]  # noqa: E731
        for sample in cut.samples:
            assert sample["finish_reason"] == "stop"
            assert sample["text"] == text[: text.find(stop)]
            # the kept tokens are the shortest prefix of the free run whose text holds the stop string
            assert sample["tokens"] == tokens[: len(sample["tokens"])]
            assert stop in detok(sample["tokens"]) and stop not in detok(sample["tokens"][:-1])
        stop_id = tokens[7]
        by_id = (
            sampler.generate(prompt, max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop_id])
            .result()
            .samples[0]
        )
        first = tokens.index(stop_id)
        assert by_id["tokens"] == tokens[: first + 1] and by_id["finish_reason"] == "stop"
        assert by_id["text"] == detok(tokens[:first])
    finally:
        sampler.cancel()


def test_capacity_and_results_name_the_sampler(client: Client):
    capacity = client.get_capacity()
    assert {device["sampler"] for device in capacity["devices"]} == {"transformers"}
    sampler = client.create_sampler("tiny")
    try:
        result = sampler.generate(["abc"], max_tokens=4, temperature=0.0).result()
        assert result.sampler == "transformers" and "transformers" in repr(result)
        info = sampler.refresh()["sub_jobs"][0].get("info") or {}
        assert info.get("sampler", {}).get("engine") == "transformers"
    finally:
        sampler.cancel()


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
