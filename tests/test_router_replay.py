"""Router replay on tiny randomly initialised MoE models with a peft LoRA adapter: routes recorded while
sampling are the ones a free forward on the sampled tokens takes; after the router's weights move, free
routing picks other experts, and replay makes the experts consume exactly the recorded ones, with gate
weights recomputed from the current logits; dense models are refused with the reason."""

from __future__ import annotations

import pytest
import torch
from cortex_backend.engine.errors import OperationError
from cortex_backend.engine.router_replay import recording_routes, replaying_routes, routes_of
from peft import LoraConfig, get_peft_model
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
)

SHAPE = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def with_lora(model: torch.nn.Module) -> torch.nn.Module:
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def tiny_mixtral() -> torch.nn.Module:
    torch.manual_seed(0)
    config = MixtralConfig(**SHAPE, num_local_experts=4, num_experts_per_tok=2)
    return with_lora(MixtralForCausalLM(config).float().eval())


def moe_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [module for module in model.modules() if hasattr(module, "gate") and hasattr(module, "experts")]


def experts_consumed(model: torch.nn.Module, input_ids: torch.Tensor) -> tuple[list, list, torch.Tensor]:
    """Run a forward with loss; return, per MoE layer, the (indices, weights) its experts were handed and
    the router's input (to recompute the logits), plus the loss."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    router_inputs: list[torch.Tensor] = []
    handles = []
    for block in moe_blocks(model):
        handles.append(
            block.experts.register_forward_pre_hook(lambda _m, args: seen.append((args[1], args[2])))
        )
        handles.append(
            block.gate.register_forward_pre_hook(lambda _m, args: router_inputs.append(args[0].detach()))
        )
    try:
        loss = model(input_ids=input_ids, labels=input_ids).loss
    finally:
        for handle in handles:
            handle.remove()
    return seen, router_inputs, loss


def sampled_batch(model: torch.nn.Module) -> tuple[torch.Tensor, object]:
    """Sample 6 tokens after two prompts while recording; the trainer's input is the sequence without its
    last token (the one no forward of the sampler saw)."""
    prompts = torch.randint(3, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    with recording_routes(model) as calls, torch.no_grad():
        torch.manual_seed(2)
        sequences = model.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=True,
            max_new_tokens=6,
            min_new_tokens=6,
            pad_token_id=0,
        )
    return sequences[:, :-1], routes_of(calls)


def test_replay_forces_the_sampled_experts_with_weights_from_current_logits():
    model = tiny_mixtral()
    input_ids, routes = sampled_batch(model)
    assert routes.shape == tuple(input_ids.shape) and len(routes.experts) == 2
    assert routes.nbytes() == 2 * input_ids.numel() * 2 * 2  # layers x tokens x top-k x int16
    free_before, _, _ = experts_consumed(model, input_ids)
    for (indices, _), recorded in zip(free_before, routes.experts, strict=True):
        # Prefill plus one decoding step per token routes as one forward over the whole sequence does.
        assert torch.equal(indices, recorded.reshape(-1, 2).long())

    with torch.no_grad():  # the trainer's router has moved away from the sampler's
        for block in moe_blocks(model):
            block.gate.weight.add_(torch.randn_like(block.gate.weight) * 3)
    model.train()
    free_after, _, free_loss = experts_consumed(model, input_ids)
    assert any(
        not torch.equal(indices, recorded.reshape(-1, 2).long())
        for (indices, _), recorded in zip(free_after, routes.experts, strict=True)
    )

    with replaying_routes(model, routes):
        replayed, router_inputs, loss = experts_consumed(model, input_ids)
    assert len(replayed) == 2
    for (indices, weights), recorded, block, hidden in zip(
        replayed, routes.experts, moe_blocks(model), router_inputs, strict=True
    ):
        assert torch.equal(indices, recorded.reshape(-1, 2).long())
        probabilities = torch.softmax(hidden @ block.gate.weight.detach().T, dim=-1).gather(-1, indices)
        torch.testing.assert_close(weights.detach(), probabilities / probabilities.sum(-1, keepdim=True))
    assert torch.isfinite(loss) and not torch.equal(loss, free_loss)
    loss.backward()
    lora = [p.grad for name, p in model.named_parameters() if "lora_" in name and p.requires_grad]
    assert lora and all(grad is not None and torch.isfinite(grad).all() for grad in lora)
    assert any(grad.abs().sum() > 0 for grad in lora)

    # The hooks live only inside the block: free routing is back after it.
    after, _, _ = experts_consumed(model, input_ids)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(after, free_after, strict=True))


def test_qwen2_moe_replays_without_renormalising_when_its_config_says_so():
    torch.manual_seed(0)
    config = Qwen2MoeConfig(
        **SHAPE,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        norm_topk_prob=False,
    )
    model = with_lora(Qwen2MoeForCausalLM(config).float().eval())
    input_ids, routes = sampled_batch(model)
    with torch.no_grad():
        for block in moe_blocks(model):
            block.gate.weight.add_(torch.randn_like(block.gate.weight) * 3)
    with replaying_routes(model, routes):
        replayed, router_inputs, loss = experts_consumed(model, input_ids)
    for (indices, weights), recorded, block, hidden in zip(
        replayed, routes.experts, moe_blocks(model), router_inputs, strict=True
    ):
        assert torch.equal(indices, recorded.reshape(-1, 2).long())
        expected = torch.softmax(hidden @ block.gate.weight.T, dim=-1).gather(-1, indices)
        torch.testing.assert_close(weights.detach(), expected)
    assert torch.isfinite(loss)


def test_a_dense_model_is_refused_with_the_reason():
    torch.manual_seed(0)
    dense = with_lora(LlamaForCausalLM(LlamaConfig(**SHAPE)))
    with pytest.raises(OperationError) as caught, recording_routes(dense):
        pass
    assert caught.value.code == "unsupported_operation"
    assert "LlamaConfig has no MoE router" in caught.value.message


def test_replay_on_another_layout_is_refused():
    model = tiny_mixtral()
    input_ids, routes = sampled_batch(model)
    with pytest.raises(OperationError) as caught, replaying_routes(model, routes), torch.no_grad():
        model(input_ids=input_ids[:, :-1])
    assert caught.value.code == "invalid_batch"
    assert "replay needs the sampled batch's layout" in caught.value.message


def test_a_checkpointed_forward_replays_the_same_routes_when_backward_runs_inside_the_block():
    model = tiny_mixtral()
    input_ids, routes = sampled_batch(model)
    with torch.no_grad():
        for block in moe_blocks(model):
            block.gate.weight.add_(torch.randn_like(block.gate.weight) * 3)
    model.train()

    def lora_gradients() -> dict[str, torch.Tensor]:
        model.zero_grad()
        with replaying_routes(model, routes):
            model(input_ids=input_ids, labels=input_ids).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    plain = lora_gradients()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    checkpointed = lora_gradients()
    assert plain.keys() == checkpointed.keys() and plain
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad)


def test_all_linear_lora_wraps_the_routers_and_replay_still_forces_the_recorded_experts():
    """peft's `all-linear` adapts a Mixtral's routers and fused experts through `ParamWrapper`s: the routers are
    still found under them, a batch records in its own layout, and replay holds against moved router weights."""
    torch.manual_seed(0)
    config = MixtralConfig(**SHAPE, num_local_experts=4, num_experts_per_tok=2)
    model = get_peft_model(
        MixtralForCausalLM(config).float().eval(), LoraConfig(r=4, target_modules="all-linear")
    )
    assert any(type(m).__name__ == "ParamWrapper" for m in model.modules())
    input_ids = torch.randint(3, 64, (3, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), recording_routes(model) as calls:
        model(input_ids=input_ids)
    routes = routes_of(calls)
    assert routes.shape == (3, 7)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 2.0)
        with recording_routes(model) as moved:
            model(input_ids=input_ids)
        assert any(
            not torch.equal(a, b) for a, b in zip(routes_of(moved).experts, routes.experts, strict=True)
        )
        with replaying_routes(model, routes), recording_routes(model) as replayed:
            model(input_ids=input_ids)
    for used, recorded in zip(routes_of(replayed).experts, routes.experts, strict=True):
        assert torch.equal(used, recorded)


def test_a_merged_moe_adapter_scores_as_the_unmerged_one():
    """A sampling sub-job merges its adapter into the base (engine/merged_lora.py), the routers' and fused
    experts' parameters included."""
    from cortex_backend.engine.merged_lora import MergedLoRA

    torch.manual_seed(0)
    config = MixtralConfig(**SHAPE, num_local_experts=4, num_experts_per_tok=2)
    model = get_peft_model(
        MixtralForCausalLM(config).float().eval(), LoraConfig(r=4, target_modules="all-linear")
    )
    input_ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
        unmerged = model(input_ids=input_ids).logits
        merged = MergedLoRA(model)
        with merged.bare():
            bare = model(input_ids=input_ids).logits
    torch.testing.assert_close(bare, unmerged, atol=1e-5, rtol=0)
    assert merged.merges == 1
