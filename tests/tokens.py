"""Tokens for other users of a running test backend, made with the real CLI."""

from __future__ import annotations

import subprocess
import sys

from .backend_process import BackendProcess


def create_token(backend: BackendProcess, name: str, scopes: tuple[str, ...] = ("jobs:read", "jobs:write")) -> str:
    output = subprocess.run(
        [sys.executable, "-m", "cortex_backend", "token", "create", "--name", name, "--scopes", *scopes,
         "--data-dir", str(backend.data_dir)],
        check=True, capture_output=True, text=True,
    )
    return output.stdout.strip()
