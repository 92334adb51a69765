"""Small source-run projects for tests: a folder with main.py (and friends) plus its cortex.yaml."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path
from typing import Any

import yaml

from cortex_nb.protocol.states import JOB_TERMINAL


def write_project(
    folder: Path,
    main_py: str,
    *,
    name: str = "test-run",
    extra_files: dict[str, str] | None = None,
    **spec: Any,
) -> Path:
    """Write main.py (dedented), extra files and a cortex.yaml; returns the spec's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "main.py").write_text(textwrap.dedent(main_py))
    for relative, text in (extra_files or {}).items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)
    document = {
        "version": 1,
        "name": name,
        "source": {"include": ["*.py"]},
        "command": ["python", "main.py"],
        "timeout_seconds": 120,
        **spec,
    }
    path = folder / "cortex.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (the test's own process excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def wait_for_log(handle, text: str, timeout_s: float = 60.0) -> list[str]:
    """Poll a run's logs until a line contains `text` (or the run ends); returns the lines."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = handle.logs()
        if any(text in line for line in lines):
            return lines
        if handle.status() in JOB_TERMINAL:
            raise AssertionError(
                f"run ended {handle.info['status']} ({handle.info.get('failure_message')}) before logging {text!r}: {lines}"
            )
        time.sleep(0.2)
    raise AssertionError(f"no log line with {text!r} within {timeout_s}s")
