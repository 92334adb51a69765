"""Checks on what clients send, each failing with a stable code and the offending field named."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from cortex_nb import strict_json
from cortex_nb.errors import ApiError
from cortex_nb.losses import LOSS_INPUTS
from cortex_nb.sampling_params import SamplingParams
from cortex_nb.states import JOB_STATES, SUB_JOB_TYPES, TRAINING

from .models import ModelCatalog, ModelInfo

# \Z, not $: "$" also matches before a trailing newline, and an id ending in one breaks every later download.
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
MODULE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.]+\Z")
DECIMAL_PATTERN = re.compile(r"[0-9]{1,18}")
# Job ids a client may not choose: the other kinds of ids the backend hands out.
RESERVED_JOB_ID_PREFIXES = ("run-", "req-", "sub-", "tok_")
MAX_SUB_JOBS = 8
MAX_PROMPTS = 1024


def _field_error(field: str, message: str, code: str = "invalid_field") -> ApiError:
    return ApiError(code, f"{field}: {message}", {"field": field})


def parse_json(raw: bytes | str, what: str = "the body", code: str = "invalid_json") -> Any:
    """Strict JSON (cortex_nb.strict_json): NaN, Infinity, runaway nesting and over-long integers are
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


def _expect_keys(value: Any, field: str, allowed: set[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _field_error(field, f"must be an object, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise _field_error(f"{field}.{unknown[0]}", f"unknown field; allowed: {sorted(allowed)}")
    return value


def dumps_strict(value: Any) -> str:
    """JSON text a strict parser (a browser's JSON.parse) accepts: a non-finite number becomes null."""
    return strict_json.dumps(value)


def check_number(value: Any, field: str, low: float | None = None, high: float | None = None, integer: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
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
        raise _field_error(field, "must be 1-64 characters of letters, digits, '_', '.', '-', starting with a letter or digit")
    return value


def validate_job_id(value: Any) -> str:
    validate_identifier(value, "job_id")
    if value.startswith(RESERVED_JOB_ID_PREFIXES):
        raise _field_error("job_id", f"may not start with {', '.join(RESERVED_JOB_ID_PREFIXES)}: those name other kinds of ids")
    return value


def validate_job_status(value: str | None) -> str | None:
    if value is not None and value not in JOB_STATES:
        raise _field_error("status", f"unknown status {value!r}; one of {list(JOB_STATES)}")
    return value


LORA_KEYS = {"r", "alpha", "dropout", "target_modules"}
OPTIMIZER_KEYS = {"lr", "betas", "eps", "weight_decay", "grad_clip"}
SUB_JOB_KEYS = {"type", "base_model", "lora", "optimizer", "max_seq_len", "seed"}
JOB_KEYS = {"job_id", "name", "experiment", "hardware", "sub_jobs", "idle_timeout_s", "labels", "training_loop"}
MAX_LABELS = 16
LABEL_KEY = re.compile(r"[a-z][a-z0-9_.-]{0,62}")


def validate_labels(labels: Any) -> dict[str, str]:
    """Free-form `{key: value}` labels shown with a job (e.g. the database and schema a Cortex SDK
    client names); they describe a job and never decide who may see it."""
    if labels is None:
        return {}
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise _field_error("labels", f"must be an object of at most {MAX_LABELS} string labels")
    for key, value in labels.items():
        if not LABEL_KEY.fullmatch(key):
            raise _field_error(f"labels.{key}", "label names are lower-case letters, digits, '_', '.', '-' (at most 63)")
        if not isinstance(value, str) or len(value) > 200:
            raise _field_error(f"labels.{key}", "must be a string of at most 200 characters")
    return dict(labels)


def _validate_lora(lora: Any, field: str, info: ModelInfo) -> dict[str, Any]:
    lora = _expect_keys(lora, field, LORA_KEYS)
    if "r" in lora:
        check_number(lora["r"], f"{field}.r", 1, 1024, integer=True)
    if "alpha" in lora:
        check_number(lora["alpha"], f"{field}.alpha", 0, 1e6)
    if "dropout" in lora:
        check_number(lora["dropout"], f"{field}.dropout", 0, 0.99)
    if "target_modules" in lora:
        modules = lora["target_modules"]
        ok = modules == "all-linear" or (
            isinstance(modules, list) and modules and all(isinstance(m, str) and MODULE_NAME_PATTERN.match(m) for m in modules)
        )
        if not ok:
            raise _field_error(f"{field}.target_modules", "must be 'all-linear' or a non-empty list of module names")
        if isinstance(modules, list):
            _check_target_modules(modules, f"{field}.target_modules", info)
    return lora


def _check_target_modules(modules: list[str], field: str, info: ModelInfo) -> None:
    """Refuse module names the model does not have now, not when its worker applies the adapter."""
    known = info.module_names
    if not known:
        return
    for module in modules:
        if not any(name == module or name.endswith("." + module) for name in known):
            leaves = sorted({name.rsplit(".", 1)[-1] for name in known})
            raise _field_error(field, f"model {info.name} has no module {module!r}; its modules are named "
                                      + ", ".join(leaves[:24]) + (" ..." if len(leaves) > 24 else ""))


def _validate_optimizer(optimizer: Any, field: str) -> dict[str, Any]:
    optimizer = _expect_keys(optimizer, field, OPTIMIZER_KEYS)
    if "lr" in optimizer:
        check_number(optimizer["lr"], f"{field}.lr", 0, 10)
    if "betas" in optimizer:
        betas = optimizer["betas"]
        if not (isinstance(betas, list) and len(betas) == 2):
            raise _field_error(f"{field}.betas", "must be a list of two numbers in [0, 1)")
        for i, beta in enumerate(betas):
            check_number(beta, f"{field}.betas[{i}]", 0, 0.999999)
    if "eps" in optimizer:
        check_number(optimizer["eps"], f"{field}.eps", 0, 1)
    if "weight_decay" in optimizer:
        check_number(optimizer["weight_decay"], f"{field}.weight_decay", 0, 10)
    if optimizer.get("grad_clip") is not None:
        check_number(optimizer["grad_clip"], f"{field}.grad_clip", 0, 1e6)
    return optimizer


def validate_job(body: Any, catalog: ModelCatalog) -> dict[str, Any]:
    """The normalised job spec, or an `ApiError` naming the first bad field."""
    body = _expect_keys(body, "job", JOB_KEYS)
    if body.get("job_id") is not None:
        validate_job_id(body["job_id"])
    for key in ("name", "experiment"):
        if body.get(key) is not None and (not isinstance(body[key], str) or len(body[key]) > 200):
            raise _field_error(key, "must be a string of at most 200 characters")
    hardware = _expect_keys(body.get("hardware"), "hardware", {"min_memory_gib"})
    if "min_memory_gib" in hardware:
        check_number(hardware["min_memory_gib"], "hardware.min_memory_gib", 0, 4096)
    if body.get("idle_timeout_s") is not None:
        # 0: never completed for idleness (the job holds its device until completed or cancelled)
        check_number(body["idle_timeout_s"], "idle_timeout_s", 0, 7 * 24 * 3600)
    labels = validate_labels(body.get("labels"))
    sub_jobs = body.get("sub_jobs")
    if not isinstance(sub_jobs, list) or not sub_jobs:
        raise _field_error("sub_jobs", "must be a non-empty list of sub-jobs")
    if len(sub_jobs) > MAX_SUB_JOBS:
        raise _field_error("sub_jobs", f"at most {MAX_SUB_JOBS} sub-jobs per job")
    normalised = []
    for i, sub in enumerate(sub_jobs):
        field = f"sub_jobs[{i}]"
        sub = _expect_keys(sub, field, SUB_JOB_KEYS)
        if sub.get("type") not in SUB_JOB_TYPES:
            raise _field_error(f"{field}.type", f"must be one of {list(SUB_JOB_TYPES)}, got {sub.get('type')!r}")
        if "base_model" not in sub:
            raise _field_error(f"{field}.base_model", "is required: the name of a registered model (see GET /v1/models)")
        info = catalog.get(sub["base_model"])
        lora = _validate_lora(sub.get("lora"), f"{field}.lora", info)
        optimizer = _validate_optimizer(sub.get("optimizer"), f"{field}.optimizer")
        if sub.get("optimizer") is not None and sub["type"] != TRAINING:
            raise _field_error(f"{field}.optimizer", "only a training sub-job has an optimizer")
        if sub.get("max_seq_len") is not None:
            check_number(sub["max_seq_len"], f"{field}.max_seq_len", 1, info.max_positions or 1 << 20, integer=True)
        seed = sub.get("seed", 0)
        check_number(seed, f"{field}.seed", 0, 2**63 - 1, integer=True)
        normalised.append({**sub, "lora": lora, "optimizer": optimizer, "seed": seed})
    trainers = [sub for sub in normalised if sub["type"] == TRAINING]
    if len(trainers) > 1:
        raise ApiError(
            "too_many_training_sub_jobs",
            f"a job has at most one training sub-job; this one has {len(trainers)}. Create one job per trainer.",
            {"field": "sub_jobs"},
        )
    # Samplers share the trainer's LoRA shape unless told otherwise, so weights sync as deltas.
    if trainers:
        for sub in normalised:
            if sub["type"] != TRAINING and not sub["lora"] and sub["base_model"] == trainers[0]["base_model"]:
                sub["lora"] = dict(trainers[0]["lora"])
    return {**body, "sub_jobs": normalised, "labels": labels}


# data plane ----------------------------------------------------------------------------------------


def _int_tensor(tensors: dict[str, np.ndarray], name: str) -> np.ndarray:
    array = tensors[name]
    if array.dtype.kind not in "iu":
        raise ApiError("invalid_batch", f"tensor '{name}' must hold integers, got {array.dtype}", {"field": name})
    return array


def validate_token_batch(
    tensors: dict[str, np.ndarray], required: tuple[str, ...], info: ModelInfo, max_seq_len: int
) -> None:
    """Shapes [B, T] agree, token ids exist in the vocabulary, and T fits the sub-job."""
    names = ("input_ids", *required)
    missing = [name for name in names if name not in tensors]
    if missing:
        raise ApiError("invalid_batch", f"the frame lacks tensor(s) {missing}; it needs {list(names)}", {"missing": missing})
    input_ids = _int_tensor(tensors, "input_ids")
    if input_ids.ndim != 2 or 0 in input_ids.shape:
        raise ApiError("invalid_batch", f"input_ids must be a non-empty [batch, length] matrix, got shape {list(input_ids.shape)}")
    for name in (*required, "attention_mask"):
        if name in tensors and tensors[name].shape != input_ids.shape:
            raise ApiError(
                "invalid_batch",
                f"tensor '{name}' has shape {list(tensors[name].shape)} but input_ids has {list(input_ids.shape)}; they must match",
                {"field": name},
            )
    if input_ids.shape[1] > max_seq_len:
        raise ApiError("invalid_batch", f"sequence length {input_ids.shape[1]} exceeds the sub-job's max_seq_len {max_seq_len}")
    for name in ("input_ids", "target_tokens"):
        if name in tensors:
            array = _int_tensor(tensors, name)
            if array.min() < 0 or array.max() >= info.vocab_size:
                raise ApiError(
                    "invalid_batch",
                    f"tensor '{name}' holds token ids outside [0, {info.vocab_size}) for model {info.name}",
                    {"field": name},
                )
    for name, array in tensors.items():
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise ApiError("invalid_batch", f"tensor '{name}' holds NaN or infinite values", {"field": name})


def validate_loss(metadata: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if "loss_fn" not in metadata:
        raise ApiError("invalid_frame", f"the frame's metadata names no loss_fn; send one of {sorted(LOSS_INPUTS)}",
                       {"field": "loss_fn"})
    loss_fn = metadata["loss_fn"]
    if not isinstance(loss_fn, str) or loss_fn not in LOSS_INPUTS:
        raise ApiError("unknown_loss", f"loss_fn {loss_fn!r} is not one of {sorted(LOSS_INPUTS)}", {"field": "loss_fn"})
    config = metadata.get("loss_fn_config") or {}
    if not isinstance(config, dict):
        raise _field_error("loss_fn_config", "must be an object")
    allowed = {"clip_low_threshold", "clip_high_threshold"} if loss_fn == "ppo" else set()
    _expect_keys(config, "loss_fn_config", allowed)
    for key, value in config.items():
        check_number(value, f"loss_fn_config.{key}", 0, 100)
    return loss_fn, config


def validate_sampling_params(params: Any) -> dict[str, Any]:
    """The normalised sampling params (cortex_nb/sampling_params.py is their one definition)."""
    return SamplingParams.from_json(params).to_json()


def validate_prompts(prompts: Any, catalog: ModelCatalog, info: ModelInfo, max_tokens: int, max_seq_len: int) -> list[list[int]]:
    """Text or token-id prompts, tokenized here so lengths are checked before anything queues."""
    if not isinstance(prompts, list) or not prompts:
        raise _field_error("prompts", "must be a non-empty list of strings or token-id lists")
    if len(prompts) > MAX_PROMPTS:
        raise _field_error("prompts", f"at most {MAX_PROMPTS} prompts per request")
    tokenized = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            ids = catalog.tokenizer(info.name).encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = prompt
            if min(ids) < 0 or max(ids) >= info.vocab_size:
                raise _field_error(f"prompts[{i}]", f"holds token ids outside [0, {info.vocab_size})", "invalid_batch")
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
