"""Errors on the Cortex SDK surface: the same JSON body as everywhere (`{"error": {code, message,
detail}}`), with statuses chosen for how the SDK reacts to them (derived from each code's category:
compat/face_errors.py `cortex_status`).

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

REASON_LIMIT = 300


def not_supported(message: str, field: str | None = None) -> ApiError:
    return ApiError("not_supported", message, {"field": field} if field else {})


def reason_phrase(code: str, message: str) -> str:
    """`code: message` as one printable ASCII line that fits an HTTP status line."""
    text = " ".join(f"{code}: {message}".split())
    text = text.encode("ascii", "replace").decode("ascii")
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 1] + "~"
