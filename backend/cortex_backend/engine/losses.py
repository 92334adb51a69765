"""The engine's function for each loss of `cortex_nb.protocol.losses.LOSSES`, one per spec, checked at
import. All sum over tokens (not means): the caller controls scale through `weights` or `advantages`,
so accumulating several batches before `step` is just a sum. The config arrives validated and complete
(the backend fills in each spec's defaults), so no default lives here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cortex_nb.protocol.losses import LOSSES

Tensors = dict[str, torch.Tensor]
LossResult = tuple[torch.Tensor, dict[str, float]]


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position, in fp32, without materialising a [B, T, V] log-softmax copy."""
    batch, length, vocab = logits.shape
    return -torch.nn.functional.cross_entropy(
        logits.reshape(-1, vocab).float(), targets.reshape(-1), reduction="none"
    ).view(batch, length)


def cross_entropy(logprobs: torch.Tensor, tensors: Tensors, config: dict[str, float]) -> LossResult:
    weights = tensors["weights"].float()
    loss = -(weights * logprobs).sum()
    return loss, {"loss:sum": loss.item(), "weights:sum": weights.sum().item()}


def _ratio(logprobs: torch.Tensor, tensors: Tensors) -> torch.Tensor:
    return torch.exp(logprobs - tensors["logprobs"].float())


def importance_sampling(logprobs: torch.Tensor, tensors: Tensors, config: dict[str, float]) -> LossResult:
    ratio = _ratio(logprobs, tensors)
    loss = -(ratio * tensors["advantages"].float()).sum()
    return loss, {"loss:sum": loss.item(), "ratio:mean": ratio.mean().item()}


def ppo(logprobs: torch.Tensor, tensors: Tensors, config: dict[str, float]) -> LossResult:
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    ratio = _ratio(logprobs, tensors)
    advantages = tensors["advantages"].float()
    objective = torch.minimum(ratio * advantages, torch.clamp(ratio, low, high) * advantages)
    return _clipped_result(-objective.sum(), ratio, low, high)


def cispo(logprobs: torch.Tensor, tensors: Tensors, config: dict[str, float]) -> LossResult:
    """Every token keeps a gradient (PPO drops the clipped ones): the clipped ratio only weights it."""
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    ratio = _ratio(logprobs, tensors)
    weight = torch.clamp(ratio, low, high).detach()
    return _clipped_result(-(weight * logprobs * tensors["advantages"].float()).sum(), ratio, low, high)


def _clipped_result(loss: torch.Tensor, ratio: torch.Tensor, low: float, high: float) -> LossResult:
    clip_fraction = ((ratio < low) | (ratio > high)).float().mean().item()
    return loss, {
        "loss:sum": loss.item(),
        "ratio:mean": ratio.mean().item(),
        "clip_fraction:mean": clip_fraction,
    }


REGISTRY: dict[str, Callable[[torch.Tensor, Tensors, dict[str, float]], LossResult]] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
}
if set(REGISTRY) != set(LOSSES):
    raise ImportError(
        f"the engine computes losses {sorted(REGISTRY)} but the protocol defines {sorted(LOSSES)}"
    )


def compute_loss(
    loss_fn: str, logprobs: torch.Tensor, tensors: Tensors, config: dict[str, Any]
) -> LossResult:
    """The scalar loss and its metrics (each named with its reduction, e.g. `loss:sum`). `config` is the
    validated config with every key of the loss's spec."""
    return REGISTRY[loss_fn](logprobs, tensors, config)
