"""What a registered model may be called: one rule for the backend's catalog and the run spec.

A model name is a label, never a path: letters, digits and `_.:-`, with at most one `/` between two such
parts so Hugging Face names (`Qwen/Qwen3-0.6B`) can be registered as they are. The backend never fetches a
name from a hub; `--model NAME=DIR` says where its files are.
"""

from __future__ import annotations

import re
from typing import Any

_PART = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
MODEL_NAME_PATTERN = re.compile(rf"{_PART}(?:/{_PART})?")
RULE = "letters, digits and _.:- with at most one '/' between two parts (e.g. Qwen/Qwen3-0.6B)"


def is_model_name(value: Any) -> bool:
    """True for a well-formed name (the whole string must match: no trailing newline, no second '/')."""
    return isinstance(value, str) and MODEL_NAME_PATTERN.fullmatch(value) is not None
