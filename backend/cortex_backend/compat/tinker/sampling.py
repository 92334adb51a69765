"""Sampling clients: a sampling session on a checkpoint (or the base model), and its samples as `generate`
requests with that checkpoint's adapter swapped in, on the trainer while it runs or on a shared sampler job
(samplers.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.sampling import MAX_PROMPT_LOGPROBS_TOPK

from ...auth import Principal
from ...data_plane import max_seq_len
from . import names, translate
from .face import TinkerFace, integer_field, untyped_future
from .sessions import SamplingSession

UNSUPPORTED_SAMPLE_FIELDS = {
    "record_stability_info": "stability information (stable_reinforce)",
}


def create_sampling_session(face: TinkerFace, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    session = face.sessions.live(principal, body.get("session_id"))
    seq = integer_field(body, "sampling_session_seq_id")
    sampler_id = names.sampling_session_id(session.id, seq)
    if sampler_id not in face.sessions.sampling:
        face.sessions.check_room(session)
        if body.get("model_path"):
            job_id, checkpoint_id, _ = names.parse_path(body["model_path"])
            row = face.service.checkpoints.find(
                principal, principal.owner, job_id, checkpoint_id, reading=True
            )
            if body.get("base_model") not in (None, row["base_model"]):
                raise ApiError(
                    "invalid_field",
                    f"base_model: {body['model_path']} was trained on {row['base_model']}",
                    {"field": "base_model"},
                )
            sampler = SamplingSession(
                sampler_id,
                principal.owner,
                row["base_model"],
                checkpoint=(job_id, checkpoint_id),
                model_path=body["model_path"],
            )
        else:
            sampler = SamplingSession(
                sampler_id, principal.owner, face.service.catalog.get(body.get("base_model")).name
            )
        face.sessions.sampling[sampler_id] = sampler
        session.samplers[seq] = sampler_id
    return {"type": "create_sampling_session", "sampling_session_id": sampler_id}


def sample(face: TinkerFace, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    sampler = face.sessions.sampling_session(principal, body.get("sampling_session_id"))
    seq = body.get("seq_id")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int)):
        raise ApiError("invalid_field", f"seq_id: must be an integer, got {seq!r}", {"field": "seq_id"})
    num_samples = integer_field(body, "num_samples", 1) if "num_samples" in body else 1
    if seq in sampler.futures:
        future = face.futures.get(principal, sampler.futures[seq])
        return untyped_future(future, sample_sequence_ids=future.render["sequence_ids"])
    for field, what in UNSUPPORTED_SAMPLE_FIELDS.items():
        if body.get(field) not in (None, 0, False):
            raise ApiError(
                "unsupported_operation", f"{field}: {what} is not supported by this backend", {"field": field}
            )
    tokens = prompt_tokens(body.get("prompt"))
    last_n = body.get("prompt_logprobs_last_n")
    wants_prompt_logprobs = bool(body.get("prompt_logprobs"))
    if last_n is not None and not (
        isinstance(last_n, int) and 1 <= last_n <= len(tokens) - 1 and wants_prompt_logprobs
    ):
        raise ApiError(
            "invalid_field",
            f"prompt_logprobs_last_n: must be from 1 to {len(tokens) - 1} with prompt_logprobs",
            {"field": "prompt_logprobs_last_n"},
        )
    topk, sample_topk = top_k_field(body, "topk_prompt_logprobs"), top_k_field(body, "topk_sample_logprobs")
    alt_k = top_k_field(body, "prompt_alt_tokens_k")
    targets = (
        target_ids(body["target_prompt_logprobs"], len(tokens))
        if body.get("target_prompt_logprobs") is not None
        else None
    )
    job_id, adapter = face.hosts.host(principal, sampler)
    job = face.service.store.get_job(job_id)
    limit = max_seq_len(face.service.requests.choose_sub_job(job, "generate", None), face.service.catalog)
    params = translate.sampling_params(
        body.get("sampling_params"), num_samples, len(tokens), limit, wants_prompt_logprobs, topk, sample_topk
    )
    if targets is not None:
        vocab = face.service.catalog.get(sampler.base_model).config.get("vocab_size")
        if isinstance(vocab, int) and int(targets.ids.max()) >= vocab:
            raise ApiError(
                "invalid_field",
                f"target_prompt_logprobs: token id {int(targets.ids.max())} is beyond the vocabulary ({vocab})",
                {"field": "target_prompt_logprobs"},
            )
        params["prompt_logprobs_targets"] = [targets.ids.tolist()]
    params["prompt_alt_tokens_k"] = alt_k
    request = {"prompts": [tokens], "sampling_params": params}
    if adapter is not None:
        request["adapter"] = adapter
    submitted = face.service.requests.submit(principal, job_id, "generate", b"", request, None)
    sequence_ids = [f"{submitted['id']}:{i}" for i in range(num_samples)]
    future = face.future_for(
        principal,
        "sample",
        job_id,
        submitted,
        sequence_ids=sequence_ids,
        last_n=last_n,
        prompt_logprobs=wants_prompt_logprobs,
        topk=topk,
        targets=targets,
        alt_k=alt_k,
    )
    if seq is not None:
        face.sessions.remember_sample(sampler, seq, future.id)
    return untyped_future(future, sample_sequence_ids=sequence_ids)


@dataclass
class TargetIds:
    """`target_prompt_logprobs` as asked: dense ids ([len - 1, K], -1 for none), and the CSR layout it came in
    (None: dense), which the answer keeps."""

    ids: np.ndarray
    csr: tuple[list[int], list[int]] | None


def target_ids(tensor: Any, prompt_length: int) -> TargetIds:
    """The SDK's JSON TensorData (dense, or sparse CSR padded with -1) as a dense [len - 1, K] int64 matrix."""
    field = "target_prompt_logprobs"

    def bad(why: str) -> ApiError:
        return ApiError("invalid_field", f"{field}: {why}", {"field": field})

    if not isinstance(tensor, dict) or tensor.get("dtype") != "int64":
        raise bad("must be an int64 TensorData of token ids")
    shape, data = tensor.get("shape"), tensor.get("data")
    if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(n, int) for n in shape)):
        raise bad(f"must be 2-D, [len(prompt) - 1, K], got shape {shape!r}")
    rows, width = shape
    if rows != prompt_length - 1 or not 1 <= width <= MAX_PROMPT_LOGPROBS_TOPK:
        raise bad(
            f"must have {prompt_length - 1} rows (len(prompt) - 1) and 1 to {MAX_PROMPT_LOGPROBS_TOPK} columns"
        )
    try:
        values = np.asarray(data, dtype=np.int64)
        crow, col = tensor.get("sparse_crow_indices"), tensor.get("sparse_col_indices")
        if crow is None and col is None:
            ids, csr = values.reshape(rows, width), None
        else:
            crow_array, col_array = np.asarray(crow, dtype=np.int64), np.asarray(col, dtype=np.int64)
            if len(crow_array) != rows + 1 or len(col_array) != len(values) or crow_array[-1] != len(values):
                raise ValueError("CSR indices do not match the data")
            ids = np.full((rows, width), -1, dtype=np.int64)
            row_of = np.repeat(np.arange(rows), np.diff(crow_array))
            ids[row_of, col_array] = values
            csr = (crow_array.tolist(), col_array.tolist())
    except (TypeError, ValueError, IndexError) as exc:
        raise bad(f"is not a valid tensor ({exc})") from None
    if (ids < -1).any() or not (ids >= 0).any():
        raise bad("holds token ids (>= 0) or -1 for none, and at least one id")
    return TargetIds(ids, csr)


def top_k_field(body: dict[str, Any], field: str) -> int:
    """A top-k count of the request (0: none), at most what the sampler gives per position."""
    value = body.get(field) or 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PROMPT_LOGPROBS_TOPK:
        raise ApiError(
            "invalid_field",
            f"{field}: must be from 0 to {MAX_PROMPT_LOGPROBS_TOPK}, got {value!r}",
            {"field": field},
        )
    return value


def prompt_tokens(prompt: Any) -> list[int]:
    """A ModelInput's token ids (text chunks only)."""
    chunks = prompt.get("chunks") if isinstance(prompt, dict) else None
    if not isinstance(chunks, list) or not chunks:
        raise ApiError(
            "invalid_field", "prompt: must be a ModelInput with at least one chunk", {"field": "prompt"}
        )
    tokens: list[int] = []
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
            kind = chunk.get("type") if isinstance(chunk, dict) else type(chunk).__name__
            raise ApiError(
                "unsupported_operation",
                f"prompt.chunks[{i}] is {kind!r}; this backend samples from text tokens only",
                {"field": f"prompt.chunks[{i}]"},
            )
        values = chunk.get("tokens")
        if not isinstance(values, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in values
        ):
            raise ApiError(
                "invalid_field",
                f"prompt.chunks[{i}].tokens: must be a list of token ids",
                {"field": f"prompt.chunks[{i}].tokens"},
            )
        tokens.extend(values)
    if not tokens:
        raise ApiError("invalid_field", "prompt: holds no tokens", {"field": "prompt"})
    return tokens
