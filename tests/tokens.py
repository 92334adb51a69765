"""Create tokens the way an operator does: with the CLI, against the backend's data dir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def create_token(data_dir: Path, name: str, *scopes: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "cortex_nb.cli", "backend", "token", "create", "--name", name, "--data-dir", str(data_dir),
         "--scopes", *scopes],
        capture_output=True, text=True, check=True,
    )
    return result.stdout.strip()
