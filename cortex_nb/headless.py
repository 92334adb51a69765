"""Run a notebook top to bottom without a browser, in a kernel of this very Python.

Used by `cortex-nb demo --notebook` and `scripts/notebooks.py refresh`. The kernel is started from
`sys.executable` (never whatever kernelspec named "python3" happens to be first on the Jupyter path),
with `CORTEX_NONINTERACTIVE=1`, so `%%cortex train` blocks and prints text progress instead of widgets
and the saved notebook reads well anywhere. Needs `nbclient` and `ipykernel` (`cortex-nb[lab]`).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .errors import CortexError


def _require_nbclient() -> None:
    try:
        import ipykernel  # noqa: F401
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError as exc:
        raise CortexError(
            f"running a notebook headless needs nbclient, nbformat and ipykernel ({exc.name} is missing);"
            " pip install 'cortex-nb[lab]'",
            code="invalid_request",
        ) from None


def _this_python_kernel_manager():
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager

    class ThisPythonKernelSpecs(KernelSpecManager):
        """Every kernel name resolves to an ipykernel running on `sys.executable`."""

        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(resource_dir=RESOURCES, **get_kernel_dict())

    return KernelManager(kernel_name="python3", kernel_spec_manager=ThisPythonKernelSpecs())


def cell_text(cell: Any) -> str:
    """The text a cell showed: its streams, then the text form of its results and errors."""
    parts = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif output["output_type"] in ("execute_result", "display_data"):
            text = output.get("data", {}).get("text/plain")
            if text:
                parts.append(text if text.endswith("\n") else text + "\n")
        elif output["output_type"] == "error":
            parts.append(f"{output['ename']}: {output['evalue']}\n")
    return "".join(parts)


def read_notebook(path: str | os.PathLike):
    _require_nbclient()  # the first thing `demo --notebook` needs: name the extra, not a traceback
    import nbformat

    return nbformat.read(str(path), as_version=4)


def execute_notebook(
    notebook: Any,
    workdir: str | os.PathLike,
    *,
    env: Mapping[str, str] | None = None,
    on_cell: Callable[[int, Any, float], None] | None = None,
    cell_timeout_s: float = 600.0,
    kernel_stderr: int | None = subprocess.DEVNULL,
):
    """Execute `notebook` (a `NotebookNode`, filled in place) with `workdir` as the kernel's current
    folder, and return it. `env` is added to this process's environment for the kernel (on top of
    `CORTEX_NONINTERACTIVE=1`); `on_cell(index, cell, seconds)` is called after each code cell.
    A failing cell raises nbclient's `CellExecutionError` naming it (the notebook then holds the outputs
    up to it). The kernel's own stderr (start-up warnings) is dropped unless `kernel_stderr` says where."""
    _require_nbclient()
    from nbclient import NotebookClient

    kernel_env = {**os.environ, "CORTEX_NONINTERACTIVE": "1", **(env or {})}
    started: dict[int, float] = {}

    def cell_started(cell: Any, cell_index: int, **_: Any) -> None:
        started[cell_index] = time.monotonic()

    def cell_done(cell: Any, cell_index: int, **_: Any) -> None:
        if on_cell is not None and cell.cell_type == "code":
            on_cell(cell_index, cell, time.monotonic() - started.get(cell_index, time.monotonic()))

    kernel = _this_python_kernel_manager()
    client = NotebookClient(
        notebook,
        km=kernel,
        timeout=int(cell_timeout_s),
        resources={"metadata": {"path": str(Path(workdir))}},
        on_cell_start=cell_started,
        on_cell_executed=cell_done,
    )
    try:
        client.execute(env=kernel_env, stderr=kernel_stderr)
    finally:
        # nbclient leaves a kernel manager it was given running: shut it down (a local backend the
        # notebook started is not the kernel's and stays; `cortex-nb demo --notebook` stops it).
        if kernel.has_kernel:
            kernel.shutdown_kernel()
    return notebook
