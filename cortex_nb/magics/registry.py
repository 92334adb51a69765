"""The subcommands of `%cortex`: each registers itself here with its `magic_arguments` parser."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def noninteractive() -> bool:
    """CORTEX_NONINTERACTIVE=1 (CI, nbval, papermill): block, print text progress, no widgets."""
    return os.environ.get("CORTEX_NONINTERACTIVE", "").strip().lower() in ("1", "true", "yes")


# `%cortex notify on|off`: a line under a job's widget when its run ends, fails or starts waiting.
# Off by default, so notebooks run under nbval keep the same outputs.
NOTIFY = {"on": False}


def notify_enabled() -> bool:
    return NOTIFY["on"]


def checkpoints_supported() -> bool:
    from ..client import Client

    return callable(getattr(Client, "list_checkpoints", None))


@dataclass
class Subcommand:
    name: str
    func: Callable[..., Any]
    kind: str  # "line" or "cell"
    summary: str


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(name: str, kind: str, summary: str, available: Callable[[], bool] | None = None):
    def register(func: Callable[..., Any]) -> Callable[..., Any]:
        if available is None or available():
            SUBCOMMANDS[name] = Subcommand(name, func, kind, summary)
        return func

    return register
