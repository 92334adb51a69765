"""What a compatibility face tells its SDK about an error, derived from the error table's category column
(cortex_nb/protocol/errors.py), so that a code added there is classified on every face at once.

An SDK retries some statuses on its own for a while (Tinker's: 408, 409, 429 and 5xx; the Cortex SDK's:
404, 409, 429 and 5xx). A refusal that retrying cannot cure (the caller's doing, or something not served
here) must never carry one of those, or the user waits out the SDK's retries before hearing it. A code
whose category is `retryable` keeps its own status: retrying it is the point.
"""

from __future__ import annotations

from cortex_nb.protocol.errors import NOT_SUPPORTED, RETRYABLE, USER_ERROR, category_of


def is_final(code: str | None) -> bool:
    """Whether retrying the same call cannot help: the caller's doing, or not served here."""
    return category_of(code) in (USER_ERROR, NOT_SUPPORTED)


def tinker_category(code: str | None) -> str:
    """Tinker's RequestErrorCategory for a failed future: "user" (the SDK raises at once) or "server"."""
    return "user" if is_final(code) else "server"


def tinker_status(code: str, status: int) -> int:
    """The status a Tinker route answers: a final refusal never answers 409, which the SDK retries."""
    return 400 if status == 409 and category_of(code) != RETRYABLE else status


# Statuses the Cortex SDK reads as "gone" rather than "wrong": a job that ended.
CORTEX_GONE_CODES = frozenset({"job_finished"})
# Chunk-group answers stay 409: the SDK reads their codes and replays the group or stops at once.
CORTEX_CHUNK_GROUP_CODES = frozenset(
    {"chunk_group_restart_required", "chunk_group_conflict", "chunk_group_missing_chunks"}
)


def cortex_status(code: str, status: int) -> int:
    """The status a Cortex SDK route answers: 501 for what cannot exist here, 410 for a job that ended,
    and for another final refusal 400 or 422 in place of the 404 or 409 the SDK would retry."""
    if code in CORTEX_CHUNK_GROUP_CODES:
        return 409
    category = category_of(code)
    if category == NOT_SUPPORTED:
        return 501
    if category == RETRYABLE:
        return status
    if code in CORTEX_GONE_CODES:
        return 410
    return {404: 400, 409: 422}.get(status, status)
