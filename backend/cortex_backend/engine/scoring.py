"""forward: per-token log-probabilities of given targets, without gradients (and, when a loss is named,
that loss and its metrics as forward_backward would report them, with nothing accumulated)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .data_parallel import rank_shares, share_of
from .losses import compute_loss, target_logprobs
from .model_state import ModelState
from .router_replay import recording_experts, replaying_experts, routed_experts


def model_logits(state: ModelState, tensors: dict[str, np.ndarray]) -> torch.Tensor:
    input_ids = state.as_tensor(tensors["input_ids"], torch.long)
    mask = tensors.get("attention_mask")
    attention_mask = state.as_tensor(mask, torch.long) if mask is not None else None
    return state.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def forward(
    state: ModelState,
    tensors: dict[str, np.ndarray],
    loss_fn: str | None = None,
    loss_fn_config: dict[str, Any] | None = None,
    replay: np.ndarray | None = None,
    record_routes: bool = False,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """`replay` and `record_routes` as for forward_backward (engine/trainer.py). Across ranks each scores its
    slice of the datums (engine/data_parallel.py)."""
    result: dict[str, Any] = {"weight_version": state.weight_version}
    share = share_of(tensors)
    local = share.local(tensors)
    with state.inference(), replaying_experts(state.model, share.local_replay(replay)):
        with recording_experts(state.model, record_routes) as calls:
            logits = model_logits(state, local)
        routed = routed_experts(calls)
        logprobs = target_logprobs(logits, state.as_tensor(local["target_tokens"], torch.long))
        if share.split:  # each rank scored its rows: the whole batch's, in order, on every rank
            logprobs = share.assemble(logprobs)
            routed = {
                name: share.assemble(torch.from_numpy(value).to(state.device), axis=1).cpu().numpy()
                for name, value in routed.items()
            }
            result["ranks"] = rank_shares(share, tensors, state.device)
        if loss_fn is not None:
            loss_inputs = {name: state.as_tensor(value) for name, value in tensors.items()}
            loss, metrics = compute_loss(loss_fn, logprobs, loss_inputs, loss_fn_config or {})
            result.update(loss=float(loss.item()), loss_fn=loss_fn, metrics=metrics)
    out = logprobs.float().cpu().numpy()
    result["shape"] = list(out.shape)
    if loss_fn is None and "weights" in tensors:
        # Optional weights score only the positions that count: the rest read 0, and the weighted NLL is summed.
        # (With a loss named, every position's logprob comes back, as forward_backward returns them.)
        weights = np.asarray(tensors["weights"], dtype=np.float32)
        result["loss:sum"] = float(-(weights * out).sum(dtype=np.float64))
        result["weights:sum"] = float(weights.sum(dtype=np.float64))
        out = np.where(weights != 0, out, np.float32(0.0))
    if replay is not None:
        result["router_replay"] = {"layers": int(replay.shape[0]), "rows": int(replay.shape[1])}
    return result, {"logprobs": out, **routed}
