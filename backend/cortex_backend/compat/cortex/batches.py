"""The SDK's model kwargs (`input_ids`, `attention_mask`, `position_ids`, `labels`) as cortex-nb frames,
and cortex-nb results in the SDK's shapes.

Label convention (docs/cortex-sdk.md): `labels[b, i]` is the token that should follow `input_ids[b, :i+1]`,
already shifted, as the SDK's `build_forward_backward_kwargs` builds them (strategy `next_token`:
`labels = roll(input_ids, -1)`, last column -100). -100 marks a position that does not count. The loss is
the cross-entropy **summed** over counted positions (`loss`, metric `loss:sum`); `avg_loss` divides it by
the number of counted positions.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from cortex_nb.protocol import wire
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.losses import LOSS_FUNCTIONS

from . import dssst1
from .errors import not_supported

IGNORE_INDEX = -100
KWARGS = {"input_ids", "attention_mask", "position_ids", "labels"}


def _batch_error(message: str, field: str | None = None) -> ApiError:
    return ApiError("invalid_batch", message, {"field": field} if field else {})


def _matrix(value: Any, name: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        raise _batch_error(f"{name} must be a [batch, seq_len] integer tensor", name) from None
    if array.dtype == np.bool_:
        array = array.astype(np.int64)
    if array.ndim != 2 or 0 in array.shape or array.dtype.kind not in "iu":
        raise _batch_error(
            f"{name} must be a non-empty [batch, seq_len] integer tensor, got shape {list(array.shape)}"
            f" and dtype {array.dtype}",
            name,
        )
    return array.astype(np.int64)


def _model_kwargs(value: Any) -> dict[str, Any]:
    """The kwargs of a `{"args": (), "kwargs": {...}}` object (or of a bare kwargs dict)."""
    if not isinstance(value, dict):
        raise _batch_error("the batch must be an object {'args': [], 'kwargs': {...}}")
    if "kwargs" not in value:
        return value
    if value.get("args") not in (None, (), []):
        raise _batch_error("positional args are not accepted; pass the model inputs as kwargs", "args")
    processing = value.get("processing")
    if processing:
        loss_fn = processing.get("loss_fn") if isinstance(processing, dict) else None
        if loss_fn not in (None, *LOSS_FUNCTIONS):
            raise ApiError(
                "unknown_loss",
                f"processing.loss_fn {loss_fn!r} is not a loss cortex-nb knows; this"
                " surface trains with cross-entropy on labels",
                {"field": "processing.loss_fn"},
            )
        if loss_fn not in (None, "cross_entropy"):
            raise not_supported(
                f"processing.loss_fn={loss_fn!r}: this surface trains with cross-entropy on labels; for"
                " importance_sampling or ppo use cortex_nb.Client.forward_backward(job_id, batch, loss_fn=...)",
                "processing.loss_fn",
            )
    extra = sorted(set(value) - {"args", "kwargs", "processing", "context"})
    if extra:
        raise _batch_error(
            f"unknown top-level key(s) {extra}; the batch is {{'args': [], 'kwargs': {{...}}}}", extra[0]
        )
    if not isinstance(value["kwargs"], dict):
        raise _batch_error("kwargs must be an object of tensors", "kwargs")
    return value["kwargs"]


def _inputs(kwargs: dict[str, Any], *, labels_required: bool) -> dict[str, np.ndarray]:
    unknown = sorted(set(kwargs) - KWARGS)
    if unknown:
        raise _batch_error(
            f"unknown model kwarg(s) {unknown}; this surface takes {sorted(KWARGS)}", unknown[0]
        )
    if "input_ids" not in kwargs:
        raise _batch_error("input_ids is required", "input_ids")
    input_ids = _matrix(kwargs["input_ids"], "input_ids")
    out = {"input_ids": input_ids}
    for name in ("attention_mask", "position_ids", "labels"):
        if kwargs.get(name) is None:
            continue
        array = _matrix(kwargs[name], name)
        if array.shape != input_ids.shape:
            raise _batch_error(
                f"{name} has shape {list(array.shape)} but input_ids has {list(input_ids.shape)}", name
            )
        out[name] = array
    if "attention_mask" in out and not np.isin(out["attention_mask"], (0, 1)).all():
        raise _batch_error("attention_mask must hold only 0 and 1", "attention_mask")
    if "position_ids" in out:
        expected = np.broadcast_to(np.arange(input_ids.shape[1]), input_ids.shape)
        if not np.array_equal(out["position_ids"], expected):
            raise not_supported(
                "position_ids other than 0..seq_len-1 per row (packed sequences) are not supported;"
                " send one sequence per row with padding and attention_mask",
                "position_ids",
            )
    if "labels" not in out:
        if labels_required:
            raise _batch_error(
                "labels is required: next-token targets, -100 where a position does not count"
                " (build_forward_backward_kwargs builds them)",
                "labels",
            )
        out["labels"] = _next_token_labels(input_ids, out.get("attention_mask"))
    labels = out["labels"]
    if ((labels < 0) & (labels != IGNORE_INDEX)).any():
        raise _batch_error(f"labels must be token ids or {IGNORE_INDEX} (ignored)", "labels")
    if not (labels != IGNORE_INDEX).any():
        raise _batch_error(f"every label is {IGNORE_INDEX}: nothing to compute a loss on", "labels")
    return out


def _next_token_labels(input_ids: np.ndarray, attention_mask: np.ndarray | None) -> np.ndarray:
    labels = np.roll(input_ids, -1, axis=1)
    labels[:, -1] = IGNORE_INDEX
    if attention_mask is not None:
        target_mask = np.roll(attention_mask, -1, axis=1)
        target_mask[:, -1] = 0
        labels[target_mask == 0] = IGNORE_INDEX
    return labels


def _frame(inputs: dict[str, np.ndarray], metadata: dict[str, Any] | None) -> bytes:
    labels = inputs["labels"]
    tensors = {
        "input_ids": inputs["input_ids"],
        "target_tokens": np.where(labels == IGNORE_INDEX, 0, labels),
        "weights": (labels != IGNORE_INDEX).astype(np.float32),
    }
    if "attention_mask" in inputs:
        tensors["attention_mask"] = inputs["attention_mask"]
    return wire.encode_frame(tensors, metadata)


def forward_backward_frame(frame: bytes) -> bytes:
    """Our forward_backward frame (cross-entropy, summed) for the SDK's DSSST1 batch frame. The frame's op
    metadata may name the sampled rows' routes to replay: `router_replay: {"sample_ids": [...]}` (or the
    list itself), one sample id (a sample's `sample_id`) per row."""
    value, op = dssst1.loads(frame)
    metadata: dict[str, Any] = {"loss_fn": "cross_entropy", **_router_replay(op)}
    return _frame(_inputs(_model_kwargs(value), labels_required=True), metadata)


def _router_replay(op: dict[str, Any]) -> dict[str, Any]:
    """Our frame metadata for the SDK frame's `router_replay` op metadata (router_replays.py checks it)."""
    named = op.get("router_replay")
    if named is None:
        return {}
    if isinstance(named, dict):
        named = named.get("sample_ids")
    return {"router_replay": named}


def forward_frame(payload: Any) -> bytes:
    """Our forward frame for the `forward` operation's payload: base64 DSSST1 bytes or JSON kwargs.
    Without labels, every next token is scored. A DSSST1 payload may name routes to replay, as
    `forward_backward_frame` reads them."""
    if isinstance(payload, dict) and "payload_b64" in payload:
        try:
            raw = base64.b64decode(payload["payload_b64"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise ApiError("invalid_frame", "payload.payload_b64 is not base64") from None
        value, op = dssst1.loads(raw)
    else:
        value, op = payload, {}
    return _frame(_inputs(_model_kwargs(value), labels_required=False), _router_replay(op) or None)


# results --------------------------------------------------------------------------------------------
def forward_backward_result(result: dict[str, Any]) -> dict[str, Any]:
    metrics = dict(result.get("metrics") or {})
    counted = metrics.get("weights:sum") or 0
    loss = result["loss"]
    avg = loss / counted if counted else None
    metrics["loss:mean"] = avg
    return {
        "loss": loss,
        "avg_loss": avg,
        "metrics": metrics,
        "loss_fn": "cross_entropy",
        "reduction": "sum",
        "tokens": counted,
        "post_process_outputs": {},
    }


def forward_result(result: dict[str, Any], tensors: bytes) -> dict[str, Any]:
    arrays, _ = wire.decode_frame(tensors)
    counted = result.get("weights:sum") or 0
    loss = result.get("loss:sum")
    return {
        "logprobs": arrays["logprobs"],
        "loss": loss,
        "avg_loss": loss / counted if counted else None,
        "tokens": counted,
        "weight_version": result.get("weight_version"),
        "reduction": "sum",
    }


def step_result(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "global_steps": result["step"],
        "last_lr": result["learning_rate"],
        "grad_norm": result["grad_norm"],
        "peak_memory": {"gpu_peak": result.get("peak_memory_bytes")},
    }


def generate_results(result: dict[str, Any], prompt_offset: int = 0) -> list[dict[str, Any]]:
    """One entry per sample, in prompt order (`n` samples of a prompt follow each other)."""
    samples = sorted(result.get("samples") or [], key=lambda s: (s["prompt_index"], s["sample_index"]))
    return [
        {
            "text": s.get("text"),
            "token_ids": s["tokens"],
            "finish_reason": s.get("finish_reason"),
            "prompt_index": s["prompt_index"] + prompt_offset,
            "sample_index": s["sample_index"],
            **({"logprobs": s["logprobs"]} if s.get("logprobs") is not None else {}),
            # A sampler bootstrapped for router replay keeps each sample's routes under this id.
            **({"sample_id": s["routes_id"]} if s.get("routes_id") else {}),
        }
        for s in samples
    ]
