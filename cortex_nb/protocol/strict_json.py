"""JSON as a strict parser (a browser's JSON.parse) reads it, in both directions.

Python's json accepts NaN and Infinity and writes them back, which breaks every other JSON reader; a
body nested 100k deep or an integer of more than 4300 digits raises RecursionError or ValueError
instead of a decode error. One definition, used by the wire format and by the backend's validation.
"""

from __future__ import annotations

import json
import math
from typing import Any


class StrictJsonError(ValueError):
    """The text is not strict JSON; the message says why in the user's words."""


def _reject_constant(name: str) -> Any:
    raise StrictJsonError(f"holds {name}; numbers must be finite")


def loads(raw: bytes | str) -> Any:
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except StrictJsonError:
        raise
    except RecursionError:
        raise StrictJsonError("is nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, and int() past 4300 digits
        raise StrictJsonError(f"is not valid JSON: {exc}") from None


def finite(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(value: Any) -> str:
    """JSON text every reader accepts: a non-finite number (a diverged loss, say) becomes null."""
    try:
        return json.dumps(value, default=str, allow_nan=False)
    except ValueError:
        return json.dumps(finite(value), default=str, allow_nan=False)
