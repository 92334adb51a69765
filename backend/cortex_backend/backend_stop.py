"""`cortex-nb backend stop`: ask the backend serving a data dir to drain and exit (SIGTERM, drain.py),
and wait until it has.

The process is found through the data dir's backend.json, and signalled only if it is this user's
`cortex_backend serve` process for that data dir (its command line says so): a stale file whose pid
now belongs to another process is never signalled.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path


def backend_pid(data_dir: Path) -> int | None:
    """The pid in DATA_DIR/backend.json if that process is the backend serving DATA_DIR, else None."""
    try:
        endpoint = json.loads((data_dir / "backend.json").read_text())
        pid = int(endpoint["pid"])
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    words = [word.decode(errors="replace") for word in arguments]
    if "cortex_backend" not in " ".join(words) or "serve" not in words:
        return None
    if "--data-dir" in words:
        given = words[words.index("--data-dir") + 1 : words.index("--data-dir") + 2]
        if not given or Path(given[0]).resolve() != data_dir.resolve():
            return None
    return pid


def stop_backend(data_dir: Path, timeout_s: float) -> tuple[bool, str]:
    """SIGTERM the backend of `data_dir` and wait up to `timeout_s` for it to exit: (stopped, what happened)."""
    pid = backend_pid(data_dir)
    if pid is None:
        return True, f"no backend is serving {data_dir}"
    os.kill(pid, signal.SIGTERM)
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not Path(f"/proc/{pid}").exists() or _zombie(pid):
            return True, f"the backend (pid {pid}) drained and stopped in {time.monotonic() - started:.1f}s"
        time.sleep(0.2)
    return False, f"the backend (pid {pid}) is still draining after {timeout_s:.0f}s; it stops by itself"


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False
