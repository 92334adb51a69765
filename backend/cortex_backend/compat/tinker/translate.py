"""Tinker's request and result shapes to ours and back: datums to a padded batch, Adam params to a step,
sampling params, LoRA flags to target modules, failure codes to the SDK's error categories."""

from __future__ import annotations

from typing import Any

import numpy as np

from cortex_nb.protocol import wire
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.losses import LOSS_INPUTS, LOSSES, TENSORS

from .messages import Datum

# The losses and their inputs are the protocol's (cortex_nb/protocol/losses.py): a loss added there is
# offered here too, under the name Tinker gives it. Inputs that may be left out, with the value they take: cross-entropy weights default to 1 per token.
DEFAULTS = {("cross_entropy", "weights"): 1.0}
INTEGER_INPUTS = {name for name, spec in TENSORS.items() if spec.integer}

# Module names per model family for Tinker's train_attn / train_mlp / train_unembed (peft matches a name
# against the end of each module's path).
LLAMA_LIKE = {"attn": ["q_proj", "k_proj", "v_proj", "o_proj"], "mlp": ["gate_proj", "up_proj", "down_proj"]}
LORA_TARGETS: dict[str, dict[str, list[str]]] = {
    **{
        family: LLAMA_LIKE
        for family in (
            "llama",
            "mistral",
            "qwen2",
            "qwen3",
            "gemma",
            "gemma2",
            "gemma3_text",
            "olmo",
            "olmo2",
            "phi3",
            "granite",
            "smollm3",
        )
    },
    "gpt2": {"attn": ["attn.c_attn", "attn.c_proj"], "mlp": ["mlp.c_fc", "mlp.c_proj"]},
}
UNEMBED = ["lm_head"]
# Tinker's LoRA scale: alpha 32 whatever the rank (peft scales by alpha / r).
LORA_ALPHA = 32


def _bad(message: str, field: str | None = None, code: str = "invalid_batch") -> ApiError:
    return ApiError(code, message, {"field": field} if field else {})


# Losses of the SDK's LossFnType this backend does not compute, and why (refused at once, never retried).
UNSERVED_LOSSES = {
    "stable_reinforce": "its objective is not published (Tinker lists it as alpha) and it needs the sampler's"
    " recorded stability info, which this backend does not record; train with ppo, cispo or gspo instead",
}


def check_loss(loss_fn: str) -> tuple[str, ...]:
    if loss_fn in UNSERVED_LOSSES:
        raise ApiError(
            "unsupported_operation",
            f"loss_fn {loss_fn!r} is not served by this backend: {UNSERVED_LOSSES[loss_fn]}",
            {"field": "loss_fn"},
        )
    if loss_fn not in LOSS_INPUTS:
        raise ApiError(
            "unknown_loss",
            f"loss_fn {loss_fn!r} is not supported by this backend; it trains with {sorted(LOSS_INPUTS)}"
            " (a custom loss works through forward_backward_custom, which uses cross_entropy)",
            {"field": "loss_fn"},
        )
    return LOSS_INPUTS[loss_fn]


def datums_to_frame(
    data: list[Datum],
    loss_fn: str,
    loss_fn_config: dict[str, Any],
    metadata: dict[str, Any],
    custom: dict[str, Any] | None = None,
) -> tuple[bytes, list[int], list[int]]:
    """Right-pad the datums into one [B, T] batch (attention 0 and every loss input 0 past each datum's end)
    and encode it as our frame; return the frame, each datum's length, and each datum's K (0 where its
    target_tokens is 1-D). [T, K] inputs (K targets per position) travel as [B, T, K], padded with weight 0 up
    to the widest datum's K; a batch of cross_entropy datums may mix [T] and [T, K] targets. With `custom` (a
    validated custom loss), the inputs are its own at their declared ranks: a rank-0 input travels repeated
    along its datum's row, and each rank-2 input has one K across the request (the loss sees it unpadded)."""
    ranks: dict[str, int] = {}
    if custom is None:
        required = check_loss(loss_fn)
        multi_target = set(LOSSES[loss_fn].multi_target)
    else:
        logprobs, *inputs = custom["inputs"]
        required = ("target_tokens", *(i["name"] for i in inputs if i["name"] != "target_tokens"))
        ranks = {"target_tokens": logprobs["rank"], **{i["name"]: i["rank"] for i in inputs}}
        multi_target = set()
    if not data:
        raise _bad("data: no datums were sent; forward_backward needs at least one", "data")
    lengths, widths = [], []
    columns: dict[str, set[int]] = {}  # the K each [T, K] input takes across the datums
    for i, datum in enumerate(data):
        length = len(datum.tokens)
        if length == 0:
            raise _bad(f"data[{i}].model_input has no tokens", f"data[{i}].model_input")
        for name, values in datum.loss_fn_inputs.items():
            where = f"data[{i}].loss_fn_inputs.{name}"
            if name not in required:
                raise _bad(f"{where}: {loss_fn} takes {list(required)}", where)
            if ranks.get(name) == 0:
                if values.size != 1:
                    raise _bad(
                        f"{where} has shape {list(values.shape)}; the custom loss takes it as a scalar (rank 0)",
                        where,
                    )
                continue
            _check_rank(values, name, where, loss_fn, ranks.get(name), name in multi_target)
            if len(values) != length:
                raise _bad(
                    f"{where} has {len(values)} values but data[{i}].model_input has {length}"
                    " tokens; every loss input needs one value (or one row of K) per input token",
                    where,
                )
            if values.ndim == 2:
                if values.shape[1] == 0:
                    raise _bad(f"{where} has shape {list(values.shape)}: K = 0 targets per position", where)
                columns.setdefault(name, set()).add(values.shape[1])
            if name in INTEGER_INPUTS and values.dtype.kind not in "iu":
                raise _bad(f"{where} must hold int64 token ids, got {values.dtype}", where)
        missing = [
            name for name in required if name not in datum.loss_fn_inputs and (loss_fn, name) not in DEFAULTS
        ]
        if missing:
            raise _bad(
                f"data[{i}].loss_fn_inputs lacks {missing}; {loss_fn} needs {list(required)}",
                f"data[{i}].loss_fn_inputs",
            )
        targets = datum.loss_fn_inputs["target_tokens"]
        width = targets.shape[1] if targets.ndim == 2 else 0
        for name in multi_target - {"target_tokens"}:
            values = datum.loss_fn_inputs.get(name)
            if values is not None and values.shape != targets.shape:
                raise _bad(
                    f"data[{i}].loss_fn_inputs.{name} has shape {list(values.shape)} but its target_tokens has"
                    f" {list(targets.shape)}; with K targets per position they must match",
                    f"data[{i}].loss_fn_inputs.{name}",
                )
        lengths.append(length)
        widths.append(width)
    if custom is not None:
        for name, found in columns.items():
            if len(found) > 1:
                raise _bad(
                    f"data[*].loss_fn_inputs.{name}: the datums' K differ ({sorted(found)}); a custom loss takes"
                    " one K per rank-2 input in a request, so send datums of other K in another request",
                    f"data.loss_fn_inputs.{name}",
                )
    longest, rows = max(lengths), len(data)
    tensors = {
        "input_ids": np.zeros((rows, longest), np.int64),
        "attention_mask": np.zeros((rows, longest), np.int64),
    }
    wide = set(columns) | (multi_target if columns else set())
    for name in required:
        # cross_entropy's target_tokens and weights share one K, the widest datum's (weights may be defaulted)
        k = max(columns.get("target_tokens" if name in multi_target else name, {1}))
        shape = (rows, longest, k) if name in wide else (rows, longest)
        tensors[name] = np.zeros(shape, np.int64 if name in INTEGER_INPUTS else np.float32)
    for i, datum in enumerate(data):
        length = lengths[i]
        tensors["input_ids"][i, :length] = datum.tokens
        tensors["attention_mask"][i, :length] = 1
        for name in required:
            value = datum.loss_fn_inputs.get(name)
            if value is None:  # a default: the target_tokens' shape
                value = np.full(datum.loss_fn_inputs["target_tokens"].shape, DEFAULTS[(loss_fn, name)])
            if ranks.get(name) == 0:
                tensors[name][i, :length] = np.reshape(value, ())
            elif name in wide:
                value = (
                    value if value.ndim == 2 else value[:, None]
                )  # a [T] datum among [T, K] ones: column 0
                tensors[name][i, :length, : value.shape[1]] = value
            else:
                tensors[name][i, :length] = value
    if custom is not None:
        return (
            wire.encode_frame(tensors, {"loss_fn": loss_fn, "custom_loss": {**custom, "format": 1}}),
            lengths,
            widths,
        )
    config = {key: value for key, value in loss_fn_config.items()}
    return (
        wire.encode_frame(tensors, {"loss_fn": loss_fn, "loss_fn_config": config, **metadata}),
        lengths,
        widths,
    )


def _check_rank(
    values: np.ndarray, name: str, where: str, loss_fn: str, declared: int | None, multi_target: bool
) -> None:
    """A loss input is [T] or [T, K]: [T, K] where a custom loss declares rank 2, and for cross_entropy's
    target_tokens and weights (K targets per position); [T] everywhere else."""
    if declared is not None:
        if values.ndim != declared:
            raise _bad(
                f"{where} has shape {list(values.shape)}; the custom loss declares it rank {declared}"
                + (" (target_tokens has the rank of logprobs)" if name == "target_tokens" else ""),
                where,
            )
        return
    if values.ndim == 2 and multi_target:
        return
    if values.ndim != 1:
        raise _bad(
            f"{where} has shape {list(values.shape)}; {loss_fn} takes one value per token (1-D)"
            + (
                "; several targets per position ([T, K]) are served by cross_entropy and custom losses"
                if values.ndim == 2
                else ""
            ),
            where,
            "unsupported_operation",
        )


def step_body(params: Any) -> dict[str, Any]:
    """AdamParams -> our step: every hyperparameter for this step (grad_clip_norm 0 = no clipping)."""
    if not isinstance(params, dict):
        raise _bad(
            "adam_params: required (the optimizer of this model is Adam)", "adam_params", "invalid_field"
        )
    unknown = sorted(
        set(params) - {"learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"}
    )
    if unknown:
        raise _bad(f"adam_params.{unknown[0]}: unknown field", f"adam_params.{unknown[0]}", "invalid_field")
    defaults = {
        "learning_rate": 1e-4,
        "beta1": 0.9,
        "beta2": 0.95,
        "eps": 1e-12,
        "weight_decay": 0.0,
        "grad_clip_norm": 0.0,
    }
    value = {**defaults, **params}
    return {
        "learning_rate": value["learning_rate"],
        "betas": [value["beta1"], value["beta2"]],
        "eps": value["eps"],
        "weight_decay": value["weight_decay"],
        "grad_clip": value["grad_clip_norm"],
    }


def lora_spec(config: Any, model_type: str) -> dict[str, Any]:
    """Tinker's LoraConfig -> our LoRA spec (alpha 32 as Tinker scales, no dropout, the chosen module groups)."""
    if not isinstance(config, dict) or "rank" not in config:
        raise _bad("lora_config: required, with a rank", "lora_config", "invalid_field")
    flags = {
        "attn": config.get("train_attn", True),
        "mlp": config.get("train_mlp", True),
        "unembed": config.get("train_unembed", True),
    }
    if not any(flags.values()):
        raise _bad(
            "lora_config: at least one of train_mlp, train_attn, train_unembed must be true",
            "lora_config",
            "invalid_field",
        )
    family = LORA_TARGETS.get(model_type)
    if family is None:
        if flags["attn"] and flags["mlp"] and not flags["unembed"]:
            modules: Any = "all-linear"
        else:
            raise _bad(
                f"lora_config: choosing train_attn/train_mlp/train_unembed is not supported for model type {model_type!r};"
                " train_attn=True, train_mlp=True, train_unembed=False trains every linear layer",
                "lora_config",
                "unsupported_operation",
            )
    else:
        modules = [name for group in ("attn", "mlp") if flags[group] for name in family[group]] + (
            UNEMBED if flags["unembed"] else []
        )
    return {"r": config["rank"], "alpha": LORA_ALPHA, "dropout": 0.0, "target_modules": modules}


def sampling_params(
    params: Any,
    num_samples: Any,
    prompt_length: int,
    max_seq_len: int,
    prompt_logprobs: bool,
    prompt_topk: int = 0,
    sample_topk: int = 0,
) -> dict[str, Any]:
    """Tinker's SamplingParams -> ours. No max_tokens samples up to the end of the context; `stop=None` stops at
    EOS, `stop=[]` never stops early."""
    params = params if isinstance(params, dict) else {}
    unknown = sorted(set(params) - {"max_tokens", "seed", "stop", "temperature", "top_k", "top_p"})
    if unknown:
        raise _bad(
            f"sampling_params.{unknown[0]}: unknown field", f"sampling_params.{unknown[0]}", "invalid_field"
        )
    max_tokens = params.get("max_tokens")
    if max_tokens is None:
        max_tokens = max_seq_len - prompt_length
    ours: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": params.get("temperature", 1.0),
        "top_p": params.get("top_p", 1.0),
        "top_k": 0 if params.get("top_k", -1) in (-1, None) else params.get("top_k"),
        "n": num_samples,
        "logprobs": True,
        "prompt_logprobs": prompt_logprobs,
        "prompt_logprobs_topk": prompt_topk,
        "logprobs_topk": sample_topk,
    }
    if params.get("seed") is not None:
        ours["seed"] = params["seed"]
    stop = params.get("stop")
    if stop == []:
        ours["ignore_eos"] = True
    elif stop is not None:
        ours["stop"] = [stop] if isinstance(stop, str) else stop
    return ours


def outputs_from_frame(
    frame: bytes, lengths: list[int], widths: list[int] | None = None
) -> dict[str, list[np.ndarray]]:
    """Our [B, T] (or [B, T, K]) logprobs back into one row per datum, each cut to the datum's own length and
    K: [T] where its target_tokens was 1-D (width 0), [T, K] where it was [T, K]."""
    tensors, _ = wire.decode_frame(frame)
    logprobs = tensors["logprobs"]
    rows = []
    for i, length in enumerate(lengths):
        width = widths[i] if widths is not None else 0
        if logprobs.ndim == 3:
            rows.append(logprobs[i, :length, :width] if width else logprobs[i, :length, 0])
        else:
            rows.append(logprobs[i, :length])
    return {"logprobs": rows}


def lora_flags(target_modules: Any, model_type: str) -> dict[str, bool | None]:
    """Our LoRA target modules -> Tinker's train_attn / train_mlp / train_unembed (the inverse of `lora_spec`);
    None where the model family's module names are not known here."""
    if target_modules == "all-linear":
        return {"train_attn": True, "train_mlp": True, "train_unembed": False}
    modules = set(target_modules or [])
    family = LORA_TARGETS.get(model_type)
    return {
        "train_attn": bool(modules & set(family["attn"])) if family else None,
        "train_mlp": bool(modules & set(family["mlp"])) if family else None,
        "train_unembed": bool(modules & set(UNEMBED)),
    }


# What the SDK's TopkLogprobs holds where a position has no entry (tinker.types.topk_logprobs.MASK_LOGPROB).
TOPK_MASK_LOGPROB = -99999.0


def dense_prompt_topk(found: dict[str, list], k: int, last_n: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Our per-position top-k (positions 1..n-1) as the SDK's dense [n, k] matrices: token ids (int32) and
    logprobs (float32), the first position (no context) and those before the last `last_n` masked."""
    ids = np.zeros((len(found["token_ids"]) + 1, k), np.int32)
    logprobs = np.full(ids.shape, TOPK_MASK_LOGPROB, np.float32)
    if found["token_ids"]:
        ids[1:] = found["token_ids"]
        logprobs[1:] = found["logprobs"]
    if last_n:
        ids[: len(ids) - last_n] = 0
        logprobs[: len(ids) - last_n] = TOPK_MASK_LOGPROB
    return ids, logprobs
