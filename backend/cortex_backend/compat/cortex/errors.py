"""Errors on the Cortex SDK surface: the same JSON body as everywhere (`{"error": {code, message,
detail}}`), with statuses chosen for how the SDK reacts to them.

The SDK retries 404 and 409 (and 429, 5xx) for about a minute. So a permanent mistake, which our own
API answers with 404 or 409, is answered here with a status the SDK does not retry: 400 for something
that does not exist, 410 for a job that has finished, 422 for a request the current state refuses.
Chunk-group answers stay 409: the SDK reads their codes and replays or stops at once. What cannot
exist on a cortex-nb backend is 501 `not_supported`, naming what to use instead.

The HTTP reason phrase carries the code and message too, because the SDK raises
`requests.HTTPError`, whose text is "STATUS Client Error: REASON for url: ...".
"""

from __future__ import annotations

from cortex_nb.protocol.errors import ApiError

CHUNK_GROUP_CODES = frozenset(
    {"chunk_group_restart_required", "chunk_group_conflict", "chunk_group_missing_chunks"}
)
GONE_CODES = frozenset({"job_finished"})
REASON_LIMIT = 300


def not_supported(message: str, field: str | None = None) -> ApiError:
    return ApiError("not_supported", message, {"field": field} if field else {})


def sdk_status(code: str, status: int) -> int:
    """The status this surface answers for an error whose code and usual status are given."""
    if code in CHUNK_GROUP_CODES:
        return 409
    if code == "not_supported":
        return 501
    if code in GONE_CODES:
        return 410
    if status == 404:
        return 400
    if status == 409:
        return 422
    return status


def reason_phrase(code: str, message: str) -> str:
    """`code: message` as one printable ASCII line that fits an HTTP status line."""
    text = " ".join(f"{code}: {message}".split())
    text = text.encode("ascii", "replace").decode("ascii")
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 1] + "~"
