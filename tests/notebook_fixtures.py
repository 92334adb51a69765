"""Fixtures for the notebook front: a real IPython shell with `%load_ext cortex_nb`, connected to the
session's real backend, and a helper that runs a cell and captures what it printed."""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

DEMO_TEXT = Path(__file__).resolve().parents[1] / "cortex_nb" / "data" / "demo.txt"


@dataclass
class CellRun:
    success: bool
    result: Any
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def run_cell(shell, code: str) -> CellRun:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        outcome = shell.run_cell(code, store_history=True)
    return CellRun(outcome.success, outcome.result, out.getvalue(), err.getvalue())


def wait_until(predicate: Callable[[], bool], timeout_s: float = 60.0, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(interval_s)


@pytest.fixture(scope="session")
def cortex_shell(backend):
    """The process-wide IPython shell, with the extension loaded and connected to the test backend."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    assert run_cell(shell, "%load_ext cortex_nb").success
    # The token is read once, at connect; it must not stay in this process's environment, which
    # Jupyter servers and kernels started by later tests inherit.
    os.environ["CORTEX_TEST_TOKEN"] = backend.token
    try:
        connected = run_cell(shell, f"%cortex connect {backend.url} --token-env CORTEX_TEST_TOKEN")
    finally:
        del os.environ["CORTEX_TEST_TOKEN"]
    assert connected.success, connected.stderr
    return shell


def train_spec(steps: int = 20, **extra: Any) -> str:
    """A YAML body for `%%cortex train` on the shipped demo text."""
    lines = [
        "base_model: tiny",
        f"data: {DEMO_TEXT}",
        f"steps: {steps}",
        "batch_size: 4",
        "max_seq_len: 64",
        "optimizer: {lr: 0.003}",
        "lora: {r: 16, alpha: 32}",
    ]
    lines += [f"{key}: {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"
