"""The built-in sampler's fast paths, in-process against transformers + peft: prompts read once by their
samples (shared-prefix attention), LoRA merged into the sampler's weights, one uniform draw per token."""

from __future__ import annotations

import copy

import pytest
import torch
from cortex_backend.engine import transformers_sampler as sampler_module
from cortex_backend.engine.adapter import adapter_parameters
from cortex_backend.engine.model_state import ModelState
from cortex_backend.engine.transformers_sampler import TransformersSampler, draw
from cortex_backend.models import ModelCatalog

PROMPTS = [[5, 17, 30, 9, 44, 61], [44], [7, 7, 7, 101, 12, 3, 88, 90, 91, 92, 4]]


def trained_state(name: str, catalog: ModelCatalog) -> ModelState:
    """A sub-job's model whose LoRA B is not zero, as after training (a fresh adapter is the identity)."""
    state = ModelState(catalog.get(name), {"lora": {"r": 4, "alpha": 8}, "seed": 1})
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter_name, parameter in adapter_parameters(state.model).items():
            if "lora_B" in parameter_name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return state


@pytest.fixture(scope="module", params=["tiny", "small-gpt2"])
def engines(request, gpt2_dir):
    """(a sampling sub-job's engine, LoRA merged; a trainer's, unmerged; the same peft model as reference).
    One engine per state, as a sub-job holds: a merged engine keeps the weights it merged into."""
    catalog = ModelCatalog({"small-gpt2": gpt2_dir})
    sampling, training = trained_state(request.param, catalog), trained_state(request.param, catalog)
    reference = copy.deepcopy(training.model).eval()
    return TransformersSampler(sampling, merge_lora=True), TransformersSampler(training), reference


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        output = model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return output[0, len(prompt) :].tolist()


def forward_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """log p(token | everything before it) for each generated token, from one plain forward pass."""
    sequence = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=sequence).logits[0, :-1].float()
    picked = torch.log_softmax(logits, dim=-1).gather(-1, sequence[0, 1:, None]).squeeze(-1)
    return picked[len(prompt) - 1 :].tolist()


@pytest.mark.parametrize("shared", [False, True], ids=["repeated-cache", "shared-prefix"])
def test_greedy_merged_and_unmerged_equal_transformers_generate(engines, monkeypatch, shared):
    """n greedy samples per prompt, LoRA merged (a sampler) and unmerged (a trainer), give generate's tokens;
    so does the shared-prefix attention forced onto greedy rows (it only serves sampled rows otherwise)."""
    merged, unmerged, reference = engines
    monkeypatch.setattr(sampler_module, "shares_prefix", lambda params, device: shared)
    converted = []
    real_share_prefix = sampler_module.share_prefix

    def recording_share_prefix(*args):
        converted.append(real_share_prefix(*args))
        return converted[-1]

    monkeypatch.setattr(sampler_module, "share_prefix", recording_share_prefix)
    params = {"max_tokens": 12, "temperature": 0.0, "n": 2, "ignore_eos": True}
    for engine in (merged, unmerged):
        result = engine.generate(PROMPTS, params)
        assert [(s["prompt_index"], s["sample_index"]) for s in result["samples"]] == [
            (p, i) for p in range(len(PROMPTS)) for i in range(2)
        ]
        for sample in result["samples"]:
            assert sample["tokens"] == hf_greedy(reference, PROMPTS[sample["prompt_index"]], 12)
    assert converted == ([True, True] if shared else [])  # the shared path really ran, for both engines


def test_stop_ids_end_each_shared_prefix_sample_at_its_own_token(engines):
    """Sampled rows on the shared-prefix path stop independently at a stop id, the id kept in tokens."""
    engine, _, reference = engines
    free = engine.generate(
        PROMPTS, {"max_tokens": 16, "temperature": 1.0, "n": 3, "seed": 4, "ignore_eos": True}
    )
    stop_id = free["samples"][0]["tokens"][5]
    stopped = engine.generate(
        PROMPTS,
        {"max_tokens": 16, "temperature": 1.0, "n": 3, "seed": 4, "ignore_eos": True, "stop": [stop_id]},
    )
    for before, after in zip(free["samples"], stopped["samples"], strict=True):
        if stop_id in before["tokens"]:
            end = before["tokens"].index(stop_id) + 1
            assert after["tokens"] == before["tokens"][:end] and after["finish_reason"] == "stop"
        else:
            assert after["tokens"] == before["tokens"] and after["finish_reason"] == "length"


def test_shared_prefix_samples_carry_the_models_own_logprobs_and_replay_by_seed(engines):
    """Sampled at temperature 1 from a shared prefill and shared-prefix attention, every sampled token's logprob
    is the one a plain forward pass of the peft model gives; the same seed gives the same samples."""
    engine, _, reference = engines
    params = {"max_tokens": 16, "temperature": 1.0, "n": 4, "seed": 11, "logprobs": True, "ignore_eos": True}
    first, again = engine.generate(PROMPTS, params), engine.generate(PROMPTS, params)
    assert [s["tokens"] for s in first["samples"]] == [s["tokens"] for s in again["samples"]]
    assert len({tuple(s["tokens"]) for s in first["samples"]}) > len(PROMPTS)  # samples of a prompt differ
    for sample in first["samples"]:
        expected = forward_logprobs(reference, PROMPTS[sample["prompt_index"]], sample["tokens"])
        assert sample["logprobs"] == pytest.approx(expected, abs=1e-4)


def test_draw_follows_the_distribution_and_never_picks_a_zero():
    """One uniform per row through the cumulative distribution: frequencies within 5 standard errors of the
    probabilities, a zero-probability token never drawn, the same generator seed the same tokens."""
    probs = torch.softmax(torch.randn(3, 40, generator=torch.Generator().manual_seed(0)) * 2, dim=-1)
    probs[:, 9] = 0.0
    probs[2] = 0.0
    probs[2, 39] = 1.0  # all mass on the last token
    probs = probs / probs.sum(dim=-1, keepdim=True)
    draws = 20000
    generator = torch.Generator().manual_seed(1)
    picked = draw(probs.repeat(draws, 1), generator).view(draws, 3)
    for row in range(3):
        frequency = torch.bincount(picked[:, row], minlength=40).double() / draws
        error = (probs[row].double() * (1 - probs[row].double()) / draws).sqrt()
        assert bool(((frequency - probs[row].double()).abs() <= 5 * error + 1e-12).all())
        assert frequency[9] == 0
    assert bool((picked[:, 2] == 39).all())
    first = draw(probs, torch.Generator().manual_seed(5))
    assert torch.equal(first, draw(probs, torch.Generator().manual_seed(5)))


def test_a_model_merged_once_refuses_a_second_merged_view():
    """A second merged sampler over weights that already hold the adapter would add it twice."""
    state = trained_state("tiny", ModelCatalog({}))
    TransformersSampler(state, merge_lora=True).refresh()
    with pytest.raises(ValueError, match="already hold a merged adapter"):
        TransformersSampler(state, merge_lora=True)
