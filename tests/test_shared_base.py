"""A sampler over an adapter host's shared base, in-process: its LoRA runs unmerged (never written into the
base weights), its numerics equal transformers' generate on the same peft model and the unhosted (merged)
sampler's, and every path that would merge into the shared base refuses."""

from __future__ import annotations

import hashlib

import pytest
import torch
from cortex_backend.adapter_host import BaseModels
from cortex_backend.engine.adapter import adapter_parameters, assign, snapshot
from cortex_backend.engine.merged_lora import MergedLoRA
from cortex_backend.engine.model_state import ModelState
from cortex_backend.engine.sampling_engine import open_engine
from cortex_backend.engine.shared_base import SharedBaseError
from cortex_backend.engine.transformers_sampler import TransformersSampler
from cortex_backend.models import ModelCatalog

from .test_sampler_paths import PROMPTS, forward_logprobs, hf_greedy

LORA = {"lora": {"r": 4, "alpha": 8}}
GREEDY = {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True, "logprobs": True}


def base_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every base parameter and buffer (the adapter's excluded), by name."""
    digest = hashlib.sha256()
    named = dict(model.named_buffers())
    named.update((name, p) for name, p in model.named_parameters() if "lora_" not in name)
    for name in sorted(named):
        digest.update(
            name.encode() + named[name].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
        )
    return digest.hexdigest()


def trained(state: ModelState, seed: int) -> None:
    """Give the adapter a LoRA B that is not zero, as training would (a fresh adapter is the identity)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in adapter_parameters(state.model).items():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)


def test_a_hosted_sampler_runs_unmerged_equals_generate_and_leaves_the_base_unchanged():
    info = ModelCatalog({}).get("tiny")
    bases = BaseModels()
    trainer = ModelState(info, {**LORA, "seed": 1}, base=bases.share(info))
    hosted = ModelState(info, {**LORA, "seed": 1}, base=bases.share(info))
    pristine = base_digest(bases.share(info))
    engine = open_engine("transformers", hosted, "sampling")
    assert hosted.base_shared and engine.describe()["lora"] == "unmerged"

    # Weight sync writes the trainer's adapter into the sampler's adapter tensors (weight_sync.run_target's
    # `assign`), twice; the sampler follows it and generates after each.
    for seed in (7, 8):
        trained(trainer, seed)
        assign(hosted.model, snapshot(trainer.model))
        engine.refresh()
        result = engine.generate(PROMPTS, GREEDY)
        reference = hosted.model.eval()
        for sample in result["samples"]:
            prompt = PROMPTS[sample["prompt_index"]]
            assert sample["tokens"] == hf_greedy(reference, prompt, 12)
            assert sample["logprobs"] == pytest.approx(
                forward_logprobs(reference, prompt, sample["tokens"]), abs=1e-4
            )
        assert base_digest(bases.share(info)) == pristine

    # The same adapter in a sampling sub-job of its own (its base its own, the LoRA merged into it): the
    # same tokens, logprobs to the sampler tests' tolerance.
    alone = ModelState(info, {**LORA, "seed": 1})
    assign(alone.model, snapshot(trainer.model))
    merged = open_engine("transformers", alone, "sampling")
    assert merged.describe()["lora"] == "merged"
    expected = merged.generate(PROMPTS, GREEDY)["samples"]
    for sample, other in zip(result["samples"], expected, strict=True):
        assert sample["tokens"] == other["tokens"]
        assert sample["logprobs"] == pytest.approx(other["logprobs"], abs=1e-4)

    # Every way to merge into the shared base refuses, and the base is as it was.
    with pytest.raises(SharedBaseError):
        TransformersSampler(hosted, merge_lora=True)
    with pytest.raises(SharedBaseError):
        MergedLoRA(hosted.model)
    with pytest.raises(SharedBaseError):
        hosted.model.merge_adapter()
    assert base_digest(bases.share(info)) == pristine
