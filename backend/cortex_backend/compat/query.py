"""Query arguments of the compatibility faces: their SDKs page with plain integers, not our `Query` models."""

from __future__ import annotations

from tornado.web import RequestHandler

from cortex_nb.protocol.errors import ApiError


def clamped_int(handler: RequestHandler, name: str, default: int, low: int = 0, high: int = 1 << 62) -> int:
    """A query integer clamped to [low, high], as the SDKs expect; a non-integer is `invalid_field`."""
    raw = handler.get_query_argument(name, None)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(
            "invalid_field", f"{name}: must be an integer, got {raw[:40]!r}", {"field": name}
        ) from None
    return max(low, min(value, high))
