"""generate: greedy equals transformers' generate token for token; seeded sampling is reproducible."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cortex_nb import Client

from .reference import ReferenceTrainer, random_batch, reference_base, reference_lora


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        output = model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    return output[0, len(prompt) :].tolist()


@pytest.mark.parametrize("model", ["tiny", "small-gpt2"])
def test_greedy_matches_transformers_generate(client: Client, gpt2_dir, model):
    vocab = next(m for m in client.list_models() if m["name"] == model)["vocab_size"]
    job = client.create_training_job(model, lora={"r": 4, "alpha": 8}, optimizer={"lr": 5e-2}, seed=2)
    reference = ReferenceTrainer(
        reference_lora(reference_base(model, gpt2_dir), r=4, alpha=8, seed=2), lr=5e-2
    )
    rng = np.random.default_rng(0)
    try:
        # Train a little on both sides so the adapter is not the identity.
        for _ in range(3):
            batch = random_batch(rng, vocab, batch=2, length=16)
            job.forward_backward(batch)
            job.step()
            reference.train_step(batch)
        # Prompts of different lengths share one batched, left-padded call.
        prompts = [rng.integers(0, vocab, size=n).tolist() for n in (3, 9, 5)]
        result = job.generate(prompts, max_tokens=24, temperature=0.0).result()
        reference.model.eval()
        for prompt, sample in zip(prompts, result.samples, strict=True):
            expected = hf_greedy(reference.model, prompt, 24)
            assert sample["tokens"] == expected[: len(sample["tokens"])]
            if sample["finish_reason"] == "length":
                assert sample["tokens"] == expected
        assert result.weight_version == 3
        # prompt_logprobs: each prompt's own log p(token | tokens before) after the first, as transformers' log-softmax.
        scored = job.generate(prompts, max_tokens=1, prompt_logprobs=True).result().raw["prompt_logprobs"]
        with torch.no_grad():
            for prompt, values in zip(prompts, scored, strict=True):
                logits = reference.model(input_ids=torch.tensor([prompt])).logits[0].float()
                expected = (
                    torch.log_softmax(logits[:-1], dim=-1)
                    .gather(-1, torch.tensor(prompt[1:])[:, None])
                    .squeeze(-1)
                )
                assert len(values) == len(prompt) - 1
                np.testing.assert_allclose(values, expected.numpy(), rtol=0, atol=1e-5)
        # prompt_logprobs_topk: the k most likely tokens at each prompt position, as transformers' top-k.
        ranked = (
            job.generate(prompts, max_tokens=1, prompt_logprobs_topk=3).result().raw["prompt_topk_logprobs"]
        )
        with torch.no_grad():
            for prompt, found in zip(prompts, ranked, strict=True):
                logits = reference.model(input_ids=torch.tensor([prompt])).logits[0].float()
                values, ids = torch.log_softmax(logits[:-1], dim=-1).topk(3, dim=-1)
                assert found["token_ids"] == ids.tolist()
                np.testing.assert_allclose(found["logprobs"], values.numpy(), rtol=0, atol=1e-5)
    finally:
        job.cancel()


def test_text_prompts_use_the_models_tokenizer(client: Client):
    sampler = client.create_sampler("small-gpt2")
    try:
        result = sampler.generate(["the quick brown"], max_tokens=8, temperature=0.0).result()
        sample = result.samples[0]
        prompt_tokens = client.tokenize("small-gpt2", ["the quick brown"])[0]
        assert client.detokenize("small-gpt2", [sample["tokens"]])[0].startswith(sample["text"])
        assert len(prompt_tokens) > 0 and isinstance(sample["text"], str)
    finally:
        sampler.cancel()


def test_seeded_sampling_is_reproducible(client: Client):
    sampler = client.create_sampler("tiny")
    try:
        params = {"max_tokens": 20, "temperature": 1.0, "top_p": 0.9, "top_k": 50, "n": 3}
        first = sampler.generate(["Once upon"], seed=42, **params).result()
        again = sampler.generate(["Once upon"], seed=42, **params).result()
        other = sampler.generate(["Once upon"], seed=43, **params).result()
        assert first.tokens == again.tokens
        assert first.tokens != other.tokens
        assert len(first.samples) == 3 and {s["sample_index"] for s in first.samples} == {0, 1, 2}
        # Three samples of one prompt from one seed are still different draws.
        assert len({tuple(t) for t in first.tokens}) > 1
        unseeded = sampler.generate(["Once upon"], **params).result()
        assert isinstance(unseeded.seed, int)  # reported, so the draw can be reproduced later
        replay = sampler.generate(["Once upon"], seed=unseeded.seed, **params).result()
        assert replay.tokens == unseeded.tokens
    finally:
        sampler.cancel()


def test_sampling_controls(client: Client):
    sampler = client.create_sampler("tiny")
    try:
        greedy = sampler.generate(["abc"], max_tokens=12, temperature=0.0).result()
        top_k_one = sampler.generate(["abc"], max_tokens=12, temperature=1.0, top_k=1, seed=9).result()
        assert top_k_one.tokens == greedy.tokens
        tiny_top_p = sampler.generate(["abc"], max_tokens=12, temperature=1.0, top_p=1e-6, seed=9).result()
        assert tiny_top_p.tokens == greedy.tokens
        with_logprobs = sampler.generate(["abc"], max_tokens=12, temperature=0.0, logprobs=True).result()
        sample = with_logprobs.samples[0]
        assert len(sample["logprobs"]) == len(sample["tokens"])
        assert sample["logprob"] == pytest.approx(sum(sample["logprobs"]))
        assert all(lp <= 0 for lp in sample["logprobs"])
        # A stop string cuts the text before it and ends the sample with finish_reason "stop".
        text = greedy.samples[0]["text"]
        stop = text[4:6]
        assert len(stop) == 2, f"greedy text too short to pick a stop string from: {text!r}"
        stopped = sampler.generate(["abc"], max_tokens=12, temperature=0.0, stop=[stop]).result().samples[0]
        assert stopped["finish_reason"] == "stop"
        assert stopped["text"] == text[: text.find(stop)]
        assert greedy.samples[0]["finish_reason"] in ("length", "stop")
    finally:
        sampler.cancel()


def test_generate_logprobs_match_forward(client: Client):
    """Sampled-token logprobs (model distribution) equal forward's logprobs for the same sequence."""
    sampler = client.create_sampler("tiny", kind="sampling")
    try:
        prompt = client.tokenize("tiny", ["hello"])[0]
        sample = (
            sampler.generate([prompt], max_tokens=10, temperature=1.0, seed=1, logprobs=True)
            .result()
            .samples[0]
        )
        sequence = prompt + sample["tokens"]
        scored = sampler.compute_logprobs([sequence]).result()[0]
        np.testing.assert_allclose(scored[len(prompt) - 1 :], sample["logprobs"], atol=1e-4)
    finally:
        sampler.cancel()
