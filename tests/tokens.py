"""Create tokens the way an operator does: with the CLI, against the backend's data dir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def create_token(
    data_dir: Path, name: str, *scopes: str, tinker: bool = False, max_priority: int | None = None
) -> str:
    """`tinker=True` asks for a key with the `tml-` prefix the Tinker SDK requires; `max_priority` caps the
    queue priority the token may ask."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cortex_nb.cli",
            "backend",
            "token",
            "create",
            "--name",
            name,
            "--data-dir",
            str(data_dir),
            "--scopes",
            *scopes,
            *(["--tinker"] if tinker else []),
            *(["--max-priority", str(max_priority)] if max_priority is not None else []),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()
