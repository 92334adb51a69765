"""Error codes and exception types shared by the backend and the client.

The backend raises `ApiError(code, message)`; the code decides the HTTP status through `ERROR_STATUS`
and the client turns the JSON body back into the matching exception class. One table, both sides.
"""

from __future__ import annotations

import builtins
from typing import Any

# code -> HTTP status. Codes are stable: clients and notebooks match on them.
ERROR_STATUS: dict[str, int] = {
    # 400: the request itself is wrong
    "invalid_request": 400,
    "invalid_json": 400,
    "invalid_field": 400,
    "invalid_frame": 400,
    "invalid_batch": 400,
    "unknown_loss": 400,
    "unknown_model": 400,
    "invalid_model_name": 400,
    "too_many_training_sub_jobs": 400,
    "unsupported_operation": 400,
    "invalid_checkpoint_id": 400,
    "chunk_mismatch": 400,
    "spec_invalid": 400,
    "exceeds_capacity": 400,
    # managed training: datasets are named by the SHA-256 of their bytes
    "hash_mismatch": 400,
    "invalid_dataset": 400,
    # source runs
    "manifest_mismatch": 400,
    "incompatible_adapter": 400,
    # 401 / 403
    "unauthenticated": 401,
    "forbidden": 403,
    # Jupyter proxy (server_extension): a backend route it never forwards
    "route_not_proxied": 403,
    # 404
    "not_found": 404,
    "job_not_found": 404,
    "request_not_found": 404,
    "route_not_found": 404,
    "checkpoint_not_found": 404,
    "run_not_found": 404,
    "output_not_declared": 404,
    "dataset_not_found": 404,
    # 405
    "method_not_allowed": 405,
    # 409: the request is fine but the state of things forbids it now
    "conflict": 409,
    # a job_id already taken (by anyone: the answer never says whose) or reserved
    "job_id_unavailable": 409,
    "job_not_running": 409,
    "job_finished": 409,
    "idempotency_key_reused": 409,
    "checkpoint_in_use": 409,
    "checkpoint_exists": 409,
    "output_not_available": 409,
    "checkpoint_corrupted": 409,
    # a cluster (the Ray executor): the model is registered on no host that is up now
    "no_host_for_model": 409,
    # a chunk group of the Cortex SDK surface (docs/cortex-sdk.md): replay it from chunk 0, or stop
    "chunk_group_restart_required": 409,
    "chunk_group_conflict": 409,
    "chunk_group_missing_chunks": 409,
    # 413 / 429 / 5xx
    "body_too_large": 413,
    "quota_exceeded": 413,
    "rate_limited": 429,
    "internal_error": 500,
    "backend_unavailable": 502,
    "version_mismatch": 502,
    # Jupyter proxy (server_extension): the server has no backend token to forward with
    "proxy_not_configured": 501,
    # a compat surface (Cortex SDK, ...) asked for something that cannot exist here; the message names
    # the cortex-nb way to do it
    "not_supported": 501,
}


def status_for(code: str) -> int:
    """HTTP status for an error code; unknown codes are server errors so they are never silent."""
    return ERROR_STATUS.get(code, 500)


class CortexError(Exception):
    """Base of every error the client raises. `code` is the backend's stable error code."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "internal_error",
        status: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.detail = detail or {}

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class ApiError(CortexError):
    """Raised inside the backend: rendered as `{"error": {code, message, detail}}` with the code's status."""

    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message, code=code, status=status_for(code), detail=detail)


class BadRequestError(CortexError):
    """The backend refused the request as malformed (HTTP 400/413)."""


class AuthError(CortexError):
    """The token is missing, wrong or revoked (HTTP 401)."""


class PermissionError(CortexError, builtins.PermissionError):
    """The token lacks a scope (HTTP 403). `missing_scopes` names what to grant."""

    @property
    def missing_scopes(self) -> list[str]:
        return list(self.detail.get("missing_scopes", []))


class NotFoundError(CortexError):
    """The job, request, checkpoint or run does not exist, or belongs to someone else (HTTP 404)."""


class ConflictError(CortexError):
    """The object is in a state that forbids the call, e.g. a finished job (HTTP 409)."""


class RateLimitError(CortexError):
    """The backend asked us to slow down (HTTP 429); retried automatically before this is raised."""


class BackendError(CortexError):
    """The backend failed (HTTP 5xx); retried automatically before this is raised."""


class ConnectionError(CortexError, builtins.ConnectionError):
    """The backend could not be reached at all."""


class RequestFailed(CortexError):
    """A data-plane request (forward_backward, generate, ...) ran and failed; `code` says why."""


class TimeoutError(CortexError, builtins.TimeoutError):
    """Waiting locally ran out of time. The remote request or job keeps running."""


class VersionMismatchError(CortexError):
    """The backend speaks a different API major version than this client."""


# source runs -------------------------------------------------------------------------------------
class SubmissionOutcomeUnknown(CortexError):
    """A run was submitted but no answer came back: it may or may not exist on the backend.

    `client.resume(err.submission_id)` returns the run if it was created; submitting again with the same
    `submission_id` is safe too (a submission id never runs twice).
    """

    def __init__(self, submission_id: str, cause: BaseException | None = None) -> None:
        super().__init__(
            f"the submission {submission_id} got no answer ({cause}); it may have been created."
            f" Call client.resume({submission_id!r}) to get the run, or submit again with the same submission_id",
            code="submission_outcome_unknown",
            detail={"submission_id": submission_id},
        )
        self.submission_id = submission_id


class OutputVerificationError(CortexError):
    """A downloaded run output does not match the length or SHA-256 the backend recorded at collection."""


class RunFailed(CortexError):
    """A source run ended failed or cancelled; `code` is its failure code (`timed_out`, `output_missing`, ...)."""


def error_class_for_status(status: int) -> type[CortexError]:
    """The client-side exception class for an HTTP error status."""
    if status == 401:
        return AuthError
    if status == 403:
        return PermissionError
    if status == 404:
        return NotFoundError
    if status == 409:
        return ConflictError
    if status == 429:
        return RateLimitError
    if status >= 500:
        return BackendError
    return BadRequestError


def error_from_response(status: int, body: Any) -> CortexError:
    """Build the typed exception for a backend error response (JSON body or not)."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code", "internal_error"))
        message = str(error.get("message", ""))
        detail = error.get("detail") if isinstance(error.get("detail"), dict) else {}
    else:
        code, message, detail = ("internal_error" if status >= 500 else "invalid_request"), str(body)[:500], {}
    return error_class_for_status(status)(message, code=code, status=status, detail=detail)
