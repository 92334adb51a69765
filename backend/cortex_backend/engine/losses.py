"""The engine's function for each loss of `cortex_nb.protocol.losses.LOSSES`, one per spec, checked at
import. All sum over tokens (not means): the caller controls scale through `weights` or `advantages`,
so accumulating several batches before `step` is just a sum. The config arrives validated and complete
(the backend fills in each spec's defaults), so no default lives here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cortex_nb.protocol.custom_loss import CUSTOM_LOSS
from cortex_nb.protocol.losses import LOSSES

from .custom_loss import custom_loss

Tensors = dict[str, torch.Tensor]
LossResult = tuple[torch.Tensor, dict[str, float]]


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position ([B, T] targets) or per position and target ([B, T, K] targets: K targets
    per position, as top-k distillation sends), in fp32, without materialising a [B, T, V] log-softmax copy."""
    batch, length, vocab = logits.shape
    if targets.ndim == 3:
        # log_softmax(x)[k] = x[k] - logsumexp(x): one [B, T] normaliser, and only the K chosen logits.
        logits = logits.float()
        return logits.gather(-1, targets) - torch.logsumexp(logits, dim=-1, keepdim=True)
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


def gspo(logprobs: torch.Tensor, tensors: Tensors, config: dict[str, float]) -> LossResult:
    """GSPO-token: each token carries its sequence's ratio (the geometric mean of the token ratios over the
    masked positions, one per batch row) as its value, and its own log-probability's gradient."""
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    in_ratio = (tensors["sequence_ratio_mask"] != 0).float()
    log_ratios = (logprobs.detach() - tensors["logprobs"].float()) * in_ratio
    # A row with no masked position has ratio 1 (a mean over nothing would be NaN).
    sequence_log_ratio = log_ratios.sum(-1, keepdim=True) / in_ratio.sum(-1, keepdim=True).clamp(min=1.0)
    ratio = torch.exp(sequence_log_ratio + logprobs - logprobs.detach())
    advantages = tensors["advantages"].float()
    objective = torch.minimum(ratio * advantages, torch.clamp(ratio, low, high) * advantages)
    return _clipped_result(-objective.sum(), ratio, low, high)


def dro(logprobs: torch.Tensor, tensors: Tensors, config: dict[str, float]) -> LossResult:
    """Off-policy REINFORCE held near the sampler by a quadratic penalty on the log-ratio."""
    log_ratio = logprobs - tensors["logprobs"].float()
    objective = logprobs * tensors["advantages"].float() - 0.5 * config["beta"] * log_ratio**2
    # Padding past a datum's end has advantage 0 but would still add its penalty: it is not part of the loss.
    if "attention_mask" in tensors:
        objective = objective * tensors["attention_mask"].float()
    loss = -objective.sum()
    return loss, {"loss:sum": loss.item()}


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
    "gspo": gspo,
    "dro": dro,
}
if set(REGISTRY) != set(LOSSES):
    raise ImportError(
        f"the engine computes losses {sorted(REGISTRY)} but the protocol defines {sorted(LOSSES)}"
    )


def sampler_mismatch(logprobs: torch.Tensor, tensors: Tensors) -> dict[str, float]:
    """|sampler logprob - trainer logprob| over the batch's sampled tokens: the positions (inside the
    attention mask) that carry a sampler logprob or an advantage; prompt and padding positions carry
    neither. 0 when the sampler had the trainer's weights; it grows as the two drift apart."""
    sampler = tensors["logprobs"].float()
    sampled = sampler != 0
    if "advantages" in tensors:
        sampled = sampled | (tensors["advantages"] != 0)
    if "attention_mask" in tensors:
        sampled = sampled & (tensors["attention_mask"] != 0)
    gap = (logprobs.detach().float() - sampler).abs()[sampled]
    if gap.numel() == 0:
        return {"sampler_mismatch_tokens:sum": 0.0}
    return {
        "sampler_mismatch:mean": gap.mean().item(),
        "sampler_mismatch:max": gap.max().item(),
        "sampler_mismatch_tokens:sum": float(gap.numel()),
    }


def compute_loss(
    loss_fn: str, logprobs: torch.Tensor, tensors: Tensors, config: dict[str, Any]
) -> LossResult:
    """The scalar loss and its metrics (each named with its reduction, e.g. `loss:sum`). `config` is the
    validated config with every key of the loss's spec. A loss that takes the sampler's logprobs also
    reports how far they are from the trainer's (`sampler_mismatch:mean`, `:max`). For a custom loss, `config`
    is its validated graph (cortex_nb/protocol/custom_loss.py)."""
    if loss_fn == CUSTOM_LOSS:
        return custom_loss(logprobs, tensors, config)
    loss, metrics = REGISTRY[loss_fn](logprobs, tensors, config)
    if "logprobs" in LOSSES[loss_fn].tensors:
        metrics.update(sampler_mismatch(logprobs, tensors))
    return loss, metrics
