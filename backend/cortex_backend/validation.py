"""Checks on what clients send that their schemas (cortex_nb/protocol/schemas) cannot make alone: the
ones that need the model catalog, the tensors of a frame, and a loss's spec. Each fails with a stable
code and names the offending field."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from cortex_nb.protocol import strict_json
from cortex_nb.protocol.custom_loss import CUSTOM_LOSS, custom_loss_spec, validate_custom_loss
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.losses import LOSSES, TENSORS, LossSpec
from cortex_nb.protocol.schemas.data_plane import MAX_PROMPTS
from cortex_nb.protocol.schemas.jobs import CreateJob
from cortex_nb.protocol.states import TRAINING

from .models import ModelCatalog, ModelInfo

# \Z, not $: "$" also matches before a trailing newline, and an id ending in one breaks every later download.
# (The schemas' IDENTIFIER says the same in JSON Schema, where "$" is the end of the text.)
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
DECIMAL_PATTERN = re.compile(r"[0-9]{1,18}")


def _field_error(field: str, message: str, code: str = "invalid_field") -> ApiError:
    return ApiError(code, f"{field}: {message}", {"field": field})


def parse_json(raw: bytes | str, what: str = "the body", code: str = "invalid_json") -> Any:
    """Strict JSON (cortex_nb.protocol.strict_json): NaN, Infinity, runaway nesting and over-long integers are
    refused with `code` rather than a 500."""
    try:
        return strict_json.loads(raw)
    except strict_json.StrictJsonError as exc:
        raise ApiError(code, f"{what} {exc}") from None


def parse_json_object(raw: bytes, what: str = "the body") -> dict[str, Any]:
    if not raw.strip():
        return {}
    value = parse_json(raw, what)
    if not isinstance(value, dict):
        raise ApiError("invalid_json", f"{what} must be a JSON object")
    return value


def parse_decimal(text: str | None, field: str, high: int = 1 << 62) -> int:
    """A non-negative integer in ASCII digits (str.isdigit also takes '²' and other Unicode digits)."""
    if text is None or not DECIMAL_PATTERN.fullmatch(text) or int(text) > high:
        raise _field_error(field, f"must be a whole number from 0 to {high} in ASCII digits, got {text!r}")
    return int(text)


def dumps_strict(value: Any) -> str:
    """JSON text a strict parser (a browser's JSON.parse) accepts: a non-finite number becomes null."""
    return strict_json.dumps(value)


def check_number(
    value: Any, field: str, low: float | None = None, high: float | None = None, integer: bool = False
) -> Any:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (integer and not isinstance(value, int))
    ):
        raise _field_error(field, f"must be {'an integer' if integer else 'a number'}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _field_error(field, f"must be a finite number, got {value!r}")
    if low is not None and value < low:
        raise _field_error(field, f"must be at least {low}, got {value}")
    if high is not None and value > high:
        raise _field_error(field, f"must be at most {high}, got {value}")
    return value


def validate_identifier(value: Any, field: str) -> str:
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise _field_error(
            field,
            "must be 1-64 characters of letters, digits, '_', '.', '-', starting with a letter or digit",
        )
    return value


def _check_target_modules(modules: list[str], field: str, info: ModelInfo) -> None:
    """Refuse module names the model does not have now, not when its worker applies the adapter."""
    known = info.module_names
    if not known:
        return
    for module in modules:
        if not any(name == module or name.endswith("." + module) for name in known):
            leaves = sorted({name.rsplit(".", 1)[-1] for name in known})
            raise _field_error(
                field,
                f"model {info.name} has no module {module!r}; its modules are named "
                + ", ".join(leaves[:24])
                + (" ..." if len(leaves) > 24 else ""),
            )


def validate_job(body: CreateJob, catalog: ModelCatalog) -> dict[str, Any]:
    """The normalised job spec. The body's shape was checked by its schema (`CreateJob`); here what
    needs the catalog: each sub-job's model exists, has the LoRA modules named, and fits max_seq_len."""
    normalised = []
    for i, sub in enumerate(body.sub_jobs):
        field = f"sub_jobs[{i}]"
        info = catalog.get(sub.base_model)
        if (
            sub.lora is not None
            and isinstance(sub.lora.target_modules, list)
            and "target_modules" in sub.lora.model_fields_set
        ):
            _check_target_modules(sub.lora.target_modules, f"{field}.lora.target_modules", info)
        if sub.max_seq_len is not None and sub.max_seq_len > (info.max_positions or 1 << 20):
            raise _field_error(
                f"{field}.max_seq_len",
                f"must be at most {info.max_positions or 1 << 20}, got {sub.max_seq_len}",
            )
        spec = sub.model_dump(exclude_unset=True)
        normalised.append(
            {
                **spec,
                "lora": spec.get("lora") or {},
                "optimizer": spec.get("optimizer") or {},
                "seed": sub.seed,
            }
        )
    # Samplers share the trainer's LoRA shape unless told otherwise, so weights sync as deltas.
    trainers = [sub for sub in normalised if sub["type"] == TRAINING]
    if trainers:
        for sub in normalised:
            if sub["type"] != TRAINING and not sub["lora"] and sub["base_model"] == trainers[0]["base_model"]:
                sub["lora"] = dict(trainers[0]["lora"])
    spec = {**body.model_dump(exclude_unset=True), "sub_jobs": normalised, "labels": body.labels or {}}
    if body.training_loop is not None:
        spec["training_loop"] = body.training_loop.normalised()
    return spec


# data plane ----------------------------------------------------------------------------------------


def _int_tensor(tensors: dict[str, np.ndarray], name: str) -> np.ndarray:
    array = tensors[name]
    if array.dtype.kind not in "iu":
        raise ApiError(
            "invalid_batch", f"tensor '{name}' must hold integers, got {array.dtype}", {"field": name}
        )
    return array


def validate_token_batch(
    tensors: dict[str, np.ndarray],
    required: tuple[str, ...],
    info: ModelInfo,
    max_seq_len: int,
    multi_target: tuple[str, ...] = (),
    wide: tuple[str, ...] = (),
    loss_name: str = "this loss",
) -> None:
    """The tensors a loss needs (its `LossSpec`) are there with their dtypes, every one has input_ids'
    [batch, length] shape (or [batch, length, K]: `multi_target` ones may, all of one shape; `wide` ones must),
    token ids exist in the vocabulary, and the length fits the sub-job."""
    names = ("input_ids", *required)
    missing = [name for name in names if name not in tensors]
    if missing:
        raise ApiError(
            "invalid_batch",
            f"the frame lacks tensor(s) {missing}; it needs {list(names)}",
            {"missing": missing},
        )
    input_ids = _int_tensor(tensors, "input_ids")
    if input_ids.ndim != 2 or 0 in input_ids.shape:
        raise ApiError(
            "invalid_batch",
            f"input_ids must be a non-empty [batch, length] matrix, got shape {list(input_ids.shape)}",
        )
    targets = tensors.get("target_tokens")
    targets_wide = targets is not None and targets.ndim == 3
    for name in (*required, "attention_mask", "weights"):
        if name not in tensors:
            continue
        _check_shape(tensors, name, multi_target, wide, targets_wide, loss_name)
        spec = TENSORS.get(name)  # a custom loss's own inputs are float32
        if spec is not None and spec.integer:
            _int_tensor(tensors, name)
    if input_ids.shape[1] > max_seq_len:
        raise ApiError(
            "invalid_batch",
            f"sequence length {input_ids.shape[1]} exceeds the sub-job's max_seq_len {max_seq_len}",
        )
    for name in ("input_ids", "target_tokens"):
        if name in tensors:
            array = tensors[name]
            if array.min() < 0 or array.max() >= info.vocab_size:
                raise ApiError(
                    "invalid_batch",
                    f"tensor '{name}' holds token ids outside [0, {info.vocab_size}) for model {info.name}",
                    {"field": name},
                )
    for name, array in tensors.items():
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise ApiError("invalid_batch", f"tensor '{name}' holds NaN or infinite values", {"field": name})


def _check_shape(
    tensors: dict[str, np.ndarray],
    name: str,
    multi_target: tuple[str, ...],
    wide: tuple[str, ...],
    targets_wide: bool,
    loss_name: str,
) -> None:
    shape, batch = list(tensors[name].shape), list(tensors["input_ids"].shape)
    if len(shape) == 3 and name not in multi_target and name not in wide:
        raise ApiError(
            "unsupported_operation",
            f"tensor '{name}' has shape {shape}: {loss_name} takes one value per position ({batch}); several"
            " targets per position ([batch, length, K]) are served by cross_entropy and by custom losses",
            {"field": name},
        )
    if name in multi_target and targets_wide:
        expected = list(tensors["target_tokens"].shape)
        if expected[:2] != batch:
            raise ApiError(
                "invalid_batch",
                f"tensor 'target_tokens' has shape {expected}; with K targets per position it must be"
                f" [batch, length, K] with [batch, length] = {batch}",
                {"field": "target_tokens"},
            )
        if shape != expected:
            raise ApiError(
                "invalid_batch",
                f"tensor '{name}' has shape {shape} but target_tokens has {expected}; with K targets per"
                " position they must match",
                {"field": name},
            )
        if expected[2] == 0:
            raise ApiError("invalid_batch", "target_tokens has K = 0 targets per position", {"field": name})
        return
    if name in wide:
        if len(shape) != 3 or shape[:2] != batch or shape[2] == 0:
            raise ApiError(
                "invalid_batch",
                f"tensor '{name}' has shape {shape}; it must be [batch, length, K] with [batch, length] = {batch}"
                " (a rank-2 input of the custom loss)",
                {"field": name},
            )
        return
    if shape != batch:
        raise ApiError(
            "invalid_batch",
            f"tensor '{name}' has shape {shape} but input_ids has {batch}; they must match",
            {"field": name},
        )


def validate_loss(metadata: dict[str, Any]) -> tuple[LossSpec, dict[str, Any]]:
    """The frame's loss and its complete config (the spec's defaults where the client sent none)."""
    if "loss_fn" not in metadata:
        raise ApiError(
            "invalid_frame",
            f"the frame's metadata names no loss_fn; send one of {sorted(LOSSES)}",
            {"field": "loss_fn"},
        )
    name = metadata["loss_fn"]
    if name == CUSTOM_LOSS:
        custom = metadata.get("custom_loss")
        if not isinstance(custom, dict):
            raise _field_error("custom_loss", "a custom loss frame carries its validated graph")
        loss = validate_custom_loss(custom.get("name"), custom.get("inputs"), custom)
        return custom_loss_spec(loss), loss
    spec = LOSSES.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ApiError(
            "unknown_loss", f"loss_fn {name!r} is not one of {sorted(LOSSES)}", {"field": "loss_fn"}
        )
    config = metadata.get("loss_fn_config") or {}
    if not isinstance(config, dict):
        raise _field_error("loss_fn_config", "must be an object")
    problem = spec.config_problem(config)
    if problem is not None:
        raise _field_error(f"loss_fn_config.{problem[0]}", problem[1])
    return spec, spec.with_defaults(config)


def validate_prompts(
    prompts: Any, catalog: ModelCatalog, info: ModelInfo, max_tokens: int, max_seq_len: int
) -> list[list[int]]:
    """Text or token-id prompts, tokenized here so lengths are checked before anything queues."""
    if not isinstance(prompts, list) or not prompts:
        raise _field_error("prompts", "must be a non-empty list of strings or token-id lists")
    if len(prompts) > MAX_PROMPTS:
        raise _field_error("prompts", f"at most {MAX_PROMPTS} prompts per request")
    tokenized = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            ids = catalog.tokenizer(info.name).encode(prompt)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            ids = prompt
            if min(ids) < 0 or max(ids) >= info.vocab_size:
                raise _field_error(
                    f"prompts[{i}]", f"holds token ids outside [0, {info.vocab_size})", "invalid_batch"
                )
        else:
            raise _field_error(f"prompts[{i}]", "must be a string or a non-empty list of token ids")
        if not ids:
            raise _field_error(f"prompts[{i}]", "tokenizes to nothing")
        if len(ids) + max_tokens > max_seq_len:
            raise _field_error(
                f"prompts[{i}]",
                f"{len(ids)} prompt tokens + max_tokens {max_tokens} exceed the sub-job's max_seq_len {max_seq_len}",
            )
        tokenized.append(ids)
    return tokenized
