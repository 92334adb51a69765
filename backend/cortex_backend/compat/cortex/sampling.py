"""The SDK's generate body (vLLM-style sampling params, one per request or one per prompt) in our terms."""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol.errors import ApiError

from .errors import not_supported

GENERATE_KEYS = {"prompts", "sampling_params", "routing_key", "strict"}
# vLLM names that mean the same here
DIRECT = ("max_tokens", "temperature", "top_p", "seed", "n", "stop", "ignore_eos")
# vLLM settings accepted only at their neutral value (anything else would be silently ignored)
NEUTRAL = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
    "min_tokens": 0,
    "min_p": 0,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "detokenize": True,
    "best_of": None,
    "prompt_logprobs": None,
    "include_stop_str_in_output": False,
}


def sampling_params(params: Any, field: str) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ApiError("invalid_field", f"{field}: must be an object", {"field": field})
    ours: dict[str, Any] = {key: params[key] for key in DIRECT if params.get(key) is not None}
    if params.get("top_k") is not None:
        ours["top_k"] = 0 if params["top_k"] == -1 else params["top_k"]  # vLLM's -1: no top-k
    if params.get("stop_token_ids"):
        stop = ours.get("stop") or []
        ours["stop"] = ([stop] if isinstance(stop, str) else list(stop)) + list(params["stop_token_ids"])
    if params.get("logprobs") is not None and params["logprobs"] is not False:
        ours["logprobs"] = True  # the chosen token's logprob, per generated token
    for key in sorted(set(params) - set(DIRECT) - {"top_k", "stop_token_ids", "logprobs"}):
        if key not in NEUTRAL:
            raise ApiError(
                "invalid_field",
                f"{field}.{key}: not a sampling setting cortex-nb knows; it takes"
                f" {sorted(set(DIRECT) | {'top_k', 'stop_token_ids', 'logprobs'})}",
                {"field": f"{field}.{key}"},
            )
        if params[key] != NEUTRAL[key]:
            raise not_supported(
                f"{field}.{key}={params[key]!r}: the cortex-nb sampler has no {key}", f"{field}.{key}"
            )
    return ours


def generate_requests(value: Any) -> list[tuple[list[Any], dict[str, Any], int]]:
    """(prompts, sampling params, index of the first prompt) per request to make: one when every prompt
    shares its params, else one per prompt."""
    if not isinstance(value, dict):
        raise ApiError("invalid_field", "the generate frame must hold an object {prompts, sampling_params}")
    unknown = sorted(set(value) - GENERATE_KEYS)
    if unknown:
        raise ApiError(
            "invalid_field",
            f"{unknown[0]}: unknown field; generate takes {sorted(GENERATE_KEYS)}",
            {"field": unknown[0]},
        )
    prompts = value.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise ApiError(
            "invalid_field",
            "prompts: must be a non-empty list of strings or token-id lists",
            {"field": "prompts"},
        )
    raw = value.get("sampling_params")
    if isinstance(raw, list):
        if len(raw) != len(prompts):
            raise ApiError(
                "invalid_field",
                f"sampling_params: {len(raw)} entries for {len(prompts)} prompts",
                {"field": "sampling_params"},
            )
        per_prompt = [sampling_params(p, f"sampling_params[{i}]") for i, p in enumerate(raw)]
        if any(p != per_prompt[0] for p in per_prompt):
            return [
                ([prompt], params, i)
                for i, (prompt, params) in enumerate(zip(prompts, per_prompt, strict=True))
            ]
        return [(prompts, per_prompt[0], 0)]
    return [(prompts, sampling_params(raw, "sampling_params"), 0)]
