"""The exceptions the client raises, one class per kind of failure, each carrying its stable code.

The codes, their HTTP statuses and meanings are one table, `cortex_nb.protocol.errors.ERROR_CODES`; the
client turns an error answer back into the class for its status (`error_from_response`).
"""

from __future__ import annotations

import builtins
from typing import Any

# The backend's names, still importable from here by code written before the table moved to the protocol.
from .protocol.errors import ERROR_STATUS, ApiError, CortexError, status_for  # noqa: F401


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


class ReplyMismatchError(CortexError):
    """A backend's answer does not match its route's schema: the client and the backend disagree on the
    contract (checked fully with CORTEX_STRICT_REPLIES=1, cheaply otherwise; see `cortex_nb.api`)."""


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
        code, message, detail = (
            ("internal_error" if status >= 500 else "invalid_request"),
            str(body)[:500],
            {},
        )
    return error_class_for_status(status)(message, code=code, status=status, detail=detail)
