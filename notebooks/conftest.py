"""nbval runs every notebook here in a kernel of its own (`pytest --nbval-lax`, set in pyproject.toml).

Each kernel starts with CORTEX_NONINTERACTIVE=1 (blocking cells, text progress, no widgets) and a fresh
CORTEX_LOCAL_DIR, so `%cortex connect --local` / `Client.local()` start a local backend of its own
in a temporary folder: a backend the user runs in ~/.local/share/cortex-nb/local is never touched, and
no notebook sees another's jobs. A local backend outlives its kernel (that is its point), so each one is
stopped once the next notebook starts, and the last at the end. Reference outputs are compared after the regexes in
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
# (notebook, its scratch folder), in the order the notebooks ran
_SCRATCH: list[tuple[Path, Path]] = []


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
    if _SCRATCH and _SCRATCH[-1][0] == item.path:
        scratch = _SCRATCH[-1][1]
    else:
        if _SCRATCH:
            _stop_local_backend(_SCRATCH[-1][1])
        scratch = Path(tempfile.mkdtemp(prefix=f"cortex-nbval-{item.path.stem}-"))
        _SCRATCH.append((item.path, scratch))
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


def _stop_local_backend(scratch: Path) -> None:
    from cortex_nb.local import find_local_backend

    backend = find_local_backend(scratch / "local")
    if backend is not None:
        backend.stop()


def pytest_unconfigure(config: pytest.Config) -> None:
    for _, scratch in _SCRATCH:
        _stop_local_backend(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
