"""forward: per-token log-probabilities of given targets, without gradients."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .losses import target_logprobs
from .model_state import ModelState


def model_logits(state: ModelState, tensors: dict[str, np.ndarray]) -> torch.Tensor:
    input_ids = state.as_tensor(tensors["input_ids"], torch.long)
    mask = tensors.get("attention_mask")
    attention_mask = state.as_tensor(mask, torch.long) if mask is not None else None
    return state.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def forward(state: ModelState, tensors: dict[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    with state.inference():
        logits = model_logits(state, tensors)
        logprobs = target_logprobs(logits, state.as_tensor(tensors["target_tokens"], torch.long))
    out = logprobs.float().cpu().numpy()
    result: dict[str, Any] = {"weight_version": state.weight_version, "shape": list(out.shape)}
    if "weights" in tensors:
        # Optional weights score only the positions that count: the rest read 0, and the weighted NLL is summed.
        weights = np.asarray(tensors["weights"], dtype=np.float32)
        result["loss:sum"] = float(-(weights * out).sum(dtype=np.float64))
        result["weights:sum"] = float(weights.sum(dtype=np.float64))
        out = np.where(weights != 0, out, np.float32(0.0))
    return result, {"logprobs": out}
