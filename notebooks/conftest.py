"""nbval runs every notebook here in a kernel of its own (`pytest --nbval-lax`, set in pyproject.toml).

Each kernel starts with CORTEX_NONINTERACTIVE=1 (blocking cells, text progress, no widgets) and a fresh
CORTEX_LOCAL_DIR, so `%cortex connect --local` / `Client.local()` start an embedded backend of its own
in a temporary folder: a backend the user runs in ~/.local/share/cortex-nb/local is never touched, and
no notebook sees another's jobs. Reference outputs are compared after the regexes in
nbval-sanitize.cfg (ids, addresses, times, durations); `python scripts/notebooks.py refresh` rewrites
them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SANITIZE = HERE / "nbval-sanitize.cfg"
_SCRATCH: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    # Set here rather than in addopts so it holds whatever folder pytest is started from.
    if getattr(config.option, "nbval_sanitize_with", "missing") is None:
        config.option.nbval_sanitize_with = str(SANITIZE)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """nbval starts a notebook's kernel while setting up its first cell; the kernel inherits the
    environment of that moment, so the variables are set around it and restored after."""
    if item.path.suffix != ".ipynb":
        yield
        return
    scratch = Path(tempfile.mkdtemp(prefix=f"cortex-nbval-{item.path.stem}-"))
    _SCRATCH.append(scratch)
    overrides = {"CORTEX_NONINTERACTIVE": "1", "CORTEX_LOCAL_DIR": str(scratch / "local")}
    saved = {name: os.environ.get(name) for name in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def pytest_unconfigure(config: pytest.Config) -> None:
    for scratch in _SCRATCH:
        shutil.rmtree(scratch, ignore_errors=True)
