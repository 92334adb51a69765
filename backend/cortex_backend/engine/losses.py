"""The three losses of forward_backward. All sum over tokens (not means): the caller controls scale
through `weights` or `advantages`, so accumulating several batches before `step` is just a sum.
"""

from __future__ import annotations

from typing import Any

import torch


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position, in fp32, without materialising a [B, T, V] log-softmax copy."""
    batch, length, vocab = logits.shape
    return -torch.nn.functional.cross_entropy(
        logits.reshape(-1, vocab).float(), targets.reshape(-1), reduction="none"
    ).view(batch, length)


def compute_loss(
    loss_fn: str, logprobs: torch.Tensor, tensors: dict[str, torch.Tensor], config: dict[str, Any]
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar loss and its metrics (each named with its reduction, e.g. `loss:sum`)."""
    if loss_fn == "cross_entropy":
        weights = tensors["weights"].float()
        loss = -(weights * logprobs).sum()
        return loss, {"loss:sum": loss.item(), "weights:sum": weights.sum().item()}
    sampling_logprobs = tensors["logprobs"].float()
    advantages = tensors["advantages"].float()
    ratio = torch.exp(logprobs - sampling_logprobs)
    if loss_fn == "importance_sampling":
        loss = -(ratio * advantages).sum()
        return loss, {"loss:sum": loss.item(), "ratio:mean": ratio.mean().item()}
    if loss_fn == "ppo":
        low = float(config.get("clip_low_threshold", 0.8))
        high = float(config.get("clip_high_threshold", 1.2))
        clipped = torch.clamp(ratio, low, high)
        objective = torch.minimum(ratio * advantages, clipped * advantages)
        loss = -objective.sum()
        clip_fraction = ((ratio < low) | (ratio > high)).float().mean().item()
        return loss, {"loss:sum": loss.item(), "ratio:mean": ratio.mean().item(), "clip_fraction:mean": clip_fraction}
    raise ValueError(f"unknown loss {loss_fn!r}")
