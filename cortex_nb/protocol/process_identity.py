"""How the local backend's state file names its process: its pid with when it started, so a client can
tell the backend that wrote the file from a later process that reused the pid."""

from __future__ import annotations

from pathlib import Path


def process_start(pid: int) -> str | None:
    """When `pid` started, as a stable token (boot-relative clock ticks on Linux); None if unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return "ticks:" + text.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    try:
        return f"epoch:{psutil.Process(pid).create_time():.2f}"
    except (psutil.Error, OSError):
        return None
