"""Router replay for MoE bases: record the experts each MoE router chose for every token of a forward (or of a
whole generation), then make a later forward on the same tokens use exactly those experts.

Why: in RL on an MoE base, the sampler and the trainer can route the same token to different experts (other
weights, other kernels, bf16 ties), so the trainer would score a different model than the one that sampled.

What replay means here: each MoE layer's expert *choice* is forced to the recorded top-k indices, while the
*gate weights* over those experts are recomputed from the current router logits, the way that router computes
them (softmax over all experts, gathered at the recorded experts, renormalised over them when the router
renormalises). Gradients reach the router through those weights, as in free routing.

Both sides work through forward hooks on the routers transformers factors out as `*TopKRouter` modules (which
return `(router_logits, weights, indices)`), held only inside a `with` block. Routes are keyed by the
router's position among the model's MoE layers, so routes recorded on one copy of a model (a sampler) replay
on another (a trainer with a peft wrapper). Architectures whose routing replay cannot reproduce are refused
with the reason (`unsupported_operation`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .errors import OperationError

# Router class name -> whether that router renormalises the gathered top-k weights. None: it follows its
# own `norm_topk_prob` setting. Each of these computes softmax(logits) -> top-k -> (optional) renormalise.
REPLAYABLE_ROUTERS: dict[str, bool | None] = {
    "MixtralTopKRouter": True,
    "Qwen2MoeTopKRouter": None,
    "Qwen3MoeTopKRouter": None,
}


@dataclass
class RecordedRoutes:
    """Expert indices per MoE layer (in layer order), each of shape (batch, tokens, top_k)."""

    experts: list[torch.Tensor]

    @property
    def shape(self) -> tuple[int, int]:
        batch, tokens, _ = self.experts[0].shape
        return batch, tokens

    def nbytes(self) -> int:
        return sum(layer.numel() * layer.element_size() for layer in self.experts)


def moe_routers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's MoE routers in layer order, or `unsupported_operation` with the reason replay cannot
    work on this model (dense, or a router whose weights replay would not reproduce)."""
    routers, foreign = [], []
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind in REPLAYABLE_ROUTERS:
            routers.append((name, module))
        elif kind.endswith("Router"):
            foreign.append(kind)
        elif (
            hasattr(module, "experts")
            and type(_unwrapped(getattr(module, "gate", None))).__name__ not in REPLAYABLE_ROUTERS
        ):
            foreign.append(f"{kind} (which routes inside the block)")
    architecture = type(getattr(model, "config", model)).__name__
    if foreign:
        raise OperationError(
            "unsupported_operation",
            f"router replay: {architecture} routes with {sorted(set(foreign))[0]}, whose gate weights replay"
            f" does not know how to recompute (it replays {sorted(REPLAYABLE_ROUTERS)}); train with free"
            " routing",
        )
    if not routers:
        raise OperationError(
            "unsupported_operation",
            f"router replay: {architecture} has no MoE router (a dense model routes nothing); replay applies"
            " to Mixtral and Qwen-MoE bases",
        )
    return routers


def _renormalises(router: nn.Module) -> bool:
    fixed = REPLAYABLE_ROUTERS[type(router).__name__]
    return bool(router.norm_topk_prob) if fixed is None else fixed


def _moe_blocks(routers: list[tuple[str, nn.Module]], model: nn.Module) -> dict[int, nn.Module]:
    """Each router's parent (its MoE block), by the router's id: the block sees (batch, tokens, hidden)
    before it flattens the tokens for its router, so a hook there tells the router's hook the batch shape."""
    router_ids = {id(router) for _, router in routers}
    parents = {}
    for module in model.modules():
        if _unwrapped(module) is not module:
            continue  # a LoRA wrapper of the router is not its block
        for child in module.children():
            if id(_unwrapped(child)) in router_ids:
                parents[id(_unwrapped(child))] = module
    return parents


def _unwrapped(module: nn.Module | None) -> nn.Module | None:
    """The module under peft's LoRA wrappers (`all-linear` wraps a Mixtral router's weight in a
    `ParamWrapper`): hooks go on the router itself, which the wrapper still calls."""
    while module is not None and isinstance(getattr(module, "base_layer", None), nn.Module):
        module = module.base_layer
    return module


@contextmanager
def recording_routes(model: nn.Module) -> Iterator[list[list[torch.Tensor]]]:
    """Record each MoE layer's expert indices while inside the block; successive forwards (a prefill, then
    one decoding step per token) are joined along the token axis. Yields a list the caller turns into
    `RecordedRoutes` with `routes_of(...)` after the block."""
    routers = moe_routers(model)
    parents = _moe_blocks(routers, model)
    calls: list[list[torch.Tensor]] = [[] for _ in routers]
    shapes: dict[int, tuple[int, int]] = {}
    handles = []
    for position, (_, router) in enumerate(routers):
        parent = parents[id(router)]

        def remember_shape(_module, args, router=router):
            hidden = args[0]
            shapes[id(router)] = (
                (hidden.shape[0], hidden.shape[1]) if hidden.dim() == 3 else (1, hidden.shape[0])
            )

        def record(_module, _args, output, router=router, position=position):
            batch, tokens = shapes[id(router)]
            # int16 holds any expert count transformers ships, at a quarter of int64's bytes.
            calls[position].append(output[2].detach().reshape(batch, tokens, -1).to("cpu", torch.int16))

        handles.append(parent.register_forward_pre_hook(remember_shape))
        handles.append(router.register_forward_hook(record))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def routes_of(calls: list[list[torch.Tensor]]) -> RecordedRoutes:
    """The routes a `recording_routes` block saw, one (batch, tokens, top_k) tensor per MoE layer."""
    if not calls or not calls[0]:
        raise OperationError("unsupported_operation", "router replay: no forward ran while recording")
    return RecordedRoutes([torch.cat(layer, dim=1) for layer in calls])


@contextmanager
def replaying_routes(model: nn.Module, routes: RecordedRoutes) -> Iterator[None]:
    """Inside the block, every MoE router of `model` uses the recorded experts for each token (the forward
    must see the same (batch, tokens) as was recorded), with gate weights recomputed from its current logits.
    With gradient checkpointing, run the backward inside the block too, so the recomputed forward replays the
    same routes."""
    routers = moe_routers(model)
    if len(routers) != len(routes.experts):
        raise OperationError(
            "invalid_batch",
            f"router replay: routes for {len(routes.experts)} MoE layers, the model has {len(routers)}",
        )
    handles = []
    for position, (name, router) in enumerate(routers):
        experts = routes.experts[position]
        renormalise = _renormalises(router)

        def replay(_module, _args, output, experts=experts, renormalise=renormalise, name=name):
            logits = output[0]
            if logits.shape[0] != experts.shape[0] * experts.shape[1]:
                raise OperationError(
                    "invalid_batch",
                    f"router replay: {name} sees {logits.shape[0]} tokens; the routes recorded"
                    f" {experts.shape[0]} x {experts.shape[1]}: replay needs the sampled batch's layout",
                )
            indices = experts.reshape(-1, experts.shape[-1]).to(logits.device, torch.long)
            weights = torch.softmax(logits.float(), dim=-1).gather(-1, indices)
            if renormalise:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(output[1].dtype), indices

        handles.append(router.register_forward_hook(replay))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


# The tensor the service adds to a forward_backward or forward frame that replays routes, and the one a
# recording forward returns: (layers, batch, tokens, top_k) expert indices, int32 on the wire.
REPLAY_TENSOR = "router_replay_experts"
ROUTED_TENSOR = "routed_experts"


def sequence_routes(model: nn.Module, sequences: list[list[int]], device: torch.device) -> list[np.ndarray]:
    """The experts `model` routes each whole sequence (prompt and sample) to, by one forward per sequence
    (after sampling, with the sampler's own weights): a (layers, tokens, top_k) int16 array per sequence.
    One forward over a sequence routes as its prefill and decoding steps did (the cache changes no input of a
    router), and it gives the layout a trainer's row has, whatever batching and padding the sampler used."""
    per_sequence = []
    with torch.no_grad():
        for sequence in sequences:
            input_ids = torch.tensor([sequence], dtype=torch.long, device=device)
            with recording_routes(model) as calls:
                model(input_ids=input_ids, use_cache=False)
            routes = routes_of(calls)
            per_sequence.append(torch.stack([layer[0] for layer in routes.experts]).numpy())
    return per_sequence


def batch_routes(experts: np.ndarray) -> RecordedRoutes:
    """Routes for a batch from the wire's (layers, batch, tokens, top_k) array."""
    return RecordedRoutes([torch.from_numpy(np.ascontiguousarray(layer)) for layer in experts])


def replaying_experts(model: nn.Module, replay: np.ndarray | None) -> AbstractContextManager[None]:
    """`replaying_routes` for the wire's array, or nothing when the request replays no routes."""
    return replaying_routes(model, batch_routes(replay)) if replay is not None else nullcontext()


@contextmanager
def recording_experts(model: nn.Module, record: bool) -> Iterator[list[list[torch.Tensor]] | None]:
    """`recording_routes` when the request asks for the experts its forward used (read them with
    `routed_experts` after the block), else nothing. Keep a backward outside it: a checkpointed backward runs
    the routers again."""
    if not record:
        yield None
        return
    with recording_routes(model) as calls:
        yield calls


def routed_experts(calls: list[list[torch.Tensor]] | None) -> dict[str, np.ndarray]:
    """The output tensor of a recording forward: (layers, batch, tokens, top_k) int32, or none."""
    if calls is None:
        return {}
    return {ROUTED_TENSOR: torch.stack(routes_of(calls).experts).numpy().astype(np.int32)}
