"""Several adapter-host slots decoded in one pass (engine/grouped_lora.py), in-process: each slot's rows go
through its own adapter (ranks, alphas and targets differ), so each request gets the tokens it gets alone
and logprobs equal to float rounding; a slot that is not plain LoRA on linear layers never groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cortex_backend.adapter_host import BaseModels
from cortex_backend.engine.grouped_lora import SlotRows, groupable, grouped
from cortex_backend.engine.model_state import ModelState
from cortex_backend.engine.sampling_engine import open_engine
from cortex_backend.models import ModelCatalog

from cortex_nb.protocol.schemas.sampling import SamplingParams

from .test_sampler_paths import PROMPTS
from .test_shared_base import trained

# (rank, alpha, targets): slots that differ in every setting their LoRA layers have.
SLOTS = [
    (4, 8, "all-linear"),
    (8, 16, ["q_proj", "v_proj"]),
    (2, 4, ["o_proj", "down_proj", "k_proj"]),
    (16, 8, "all-linear"),
]


@pytest.fixture(scope="module")
def slots():
    info = ModelCatalog({}).get("tiny")
    bases = BaseModels()
    states = []
    for index, (r, alpha, targets) in enumerate(SLOTS):
        spec = {"lora": {"r": r, "alpha": alpha, "target_modules": targets}, "seed": index}
        state = ModelState(info, spec, base=bases.share(info))
        trained(state, seed=100 + index)
        states.append(state)
    return states


def one_pass(states, prompt_lists, seeds, params):
    """Every state's prompts sampled in one pass of the first state's engine, each through its own adapter."""
    engines = [open_engine("transformers", state, "sampling") for state in states]
    groups = [
        SlotRows(state.model.get_base_model(), len(prompts), len(prompts) * params.n)
        for state, prompts in zip(states, prompt_lists, strict=True)
    ]
    with grouped(states[0].model.get_base_model(), groups):
        return engines[0].sample_requests(prompt_lists, seeds, params, lambda: False)


def forward_greedy(model, prompt: list[int], count: int) -> list[int]:
    """Greedy tokens from plain forwards of the whole sequence (no cache; transformers' generate would
    suppress the end-of-sequence token these adapters like, under `min_new_tokens`)."""
    sequence = list(prompt)
    with torch.no_grad():
        for _ in range(count):
            sequence.append(int(model(input_ids=torch.tensor([sequence])).logits[0, -1].argmax()))
    return sequence[len(prompt) :]


def alone(state, prompts, seed, params):
    engine = open_engine("transformers", state, "sampling")
    return engine.sample_requests([prompts], [seed], params, lambda: False)[0]


def assert_same(together, by_itself):
    assert [s["tokens"] for s in together] == [s["tokens"] for s in by_itself]
    for mine, theirs in zip(together, by_itself, strict=True):
        np.testing.assert_allclose(mine["logprobs"], theirs["logprobs"], rtol=0, atol=1e-5)


def test_greedy_rows_of_four_slots_equal_each_slot_alone_and_plain_forwards(slots):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=True)
    prompt_lists = [PROMPTS, PROMPTS[1:], [PROMPTS[2]], PROMPTS[:2]]
    together = one_pass(slots, prompt_lists, [None] * 4, params)
    distinct = set()
    for state, prompts, samples in zip(slots, prompt_lists, together, strict=True):
        assert_same(samples, alone(state, prompts, None, params))
        model = state.model.eval()
        for sample in samples:
            assert sample["tokens"] == forward_greedy(model, prompts[sample["prompt_index"]], 12)
            distinct.add(str(sample["tokens"]))
    # The slots' adapters differ enough to sample differently: a pass that used one adapter for all
    # rows would fail the comparison above.
    assert len(distinct) > len(PROMPTS)


def test_seeded_samples_of_four_slots_equal_each_alone(slots):
    params = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.95, n=3, ignore_eos=True, logprobs=True)
    prompt_lists = [PROMPTS[:2], [PROMPTS[2]], PROMPTS, [PROMPTS[0]]]
    seeds = [11, 22, 33, 44]
    together = one_pass(slots, prompt_lists, seeds, params)
    for state, prompts, seed, samples in zip(slots, prompt_lists, seeds, together, strict=True):
        assert_same(samples, alone(state, prompts, seed, params))


def test_one_slot_twice_and_the_pass_leaves_the_models_as_they_were(slots):
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=True)
    states = [slots[1], slots[1], slots[3]]
    prompt_lists = [[PROMPTS[0]], [PROMPTS[2]], [PROMPTS[1]]]
    together = one_pass(states, prompt_lists, [None] * 3, params)
    for state, prompts, samples in zip(states, prompt_lists, together, strict=True):
        assert_same(samples, alone(state, prompts, None, params))
    # No patched forward is left behind: every module runs its class's own forward again.
    for state in slots:
        assert not any("forward" in vars(module) for module in state.model.modules())


def test_only_plain_lora_on_linear_layers_groups(slots):
    info = ModelCatalog({}).get("tiny")
    bases = BaseModels()
    assert all(groupable(state.model.get_base_model()) for state in slots)
    embedding = ModelState(
        info, {"lora": {"r": 4, "target_modules": ["embed_tokens", "q_proj"]}}, base=bases.share(info)
    )
    assert not groupable(embedding.model.get_base_model())
    own_head = ModelState(info, {"lora": {"r": 4}}, base=bases.share(info))
    own_head.model.get_base_model().lm_head.weight = torch.nn.Parameter(
        own_head.model.get_base_model().lm_head.weight.clone()
    )
    assert not groupable(own_head.model.get_base_model())
