"""Showing a run's outputs in the notebook: download them next to the notebook, then display each one
by its kind (JSON pretty-printed, CSV as a DataFrame, PNG as an image, anything else as a line).

`%%cortex run` calls `fetch_and_display_outputs(handle)` once the run is done.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runs import RunHandle

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_PRETTY_BYTES = 1 << 20


def render_output(name: str, path: Path) -> Any:
    """The object that displays one downloaded output best (an IPython display object or a DataFrame)."""
    from IPython.display import Image, Pretty

    suffix = path.suffix.lower()
    size = path.stat().st_size
    if suffix == ".json" and size <= MAX_PRETTY_BYTES:
        try:
            value = json.loads(path.read_text())
        except (UnicodeDecodeError, ValueError):
            pass
        else:
            return Pretty(
                f"{name} ({path}):\n{json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)}"
            )
    if suffix in (".csv", ".tsv"):
        import pandas as pd

        try:
            return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",")
        except (ValueError, UnicodeDecodeError, pd.errors.ParserError):
            pass
    if suffix == ".png" or path.read_bytes()[:8] == PNG_SIGNATURE:
        return Image(filename=str(path))
    return Pretty(f"{name}: {path} ({size} bytes)")


def fetch_and_display_outputs(
    handle: RunHandle,
    dest_dir: str | os.PathLike | None = None,
    display: Callable[[Any], Any] | None = None,
) -> dict[str, Path]:
    """Download every collected output of `handle` under `dest_dir` (default: the current folder, which
    in a kernel is the notebook's) at its declared relative path, verified, and display each.

    Returns name -> local path. `display` defaults to `IPython.display.display`.
    """
    if display is None:
        from IPython.display import display
    paths = handle.outputs(dest=Path(dest_dir or Path.cwd()), keep_paths=True)
    for name, path in sorted(paths.items()):
        display(render_output(name, path))
    return paths
