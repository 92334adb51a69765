"""The unprivileged uids runs execute as when the backend is root: one per concurrent run.

A uid of its own means a run cannot signal or read another run's processes or files, its process
limit (RLIMIT_NPROC) counts only its own processes, and after it ends every process still owned by
that uid can be found and killed, whatever it did to escape its process group.
"""

from __future__ import annotations

import os
import signal
import time


class UidPool:
    def __init__(self, base: int, size: int) -> None:
        self.base = base
        self.size = size
        self._taken: set[int] = set()

    def acquire(self) -> int:
        for uid in range(self.base, self.base + self.size):
            if uid not in self._taken:
                self._taken.add(uid)
                return uid
        raise RuntimeError("every run uid is taken; the pool is as large as the device slots, so this is a bug")

    def release(self, uid: int) -> None:
        self._taken.discard(uid)

    def __contains__(self, uid: int) -> bool:
        return self.base <= uid < self.base + self.size


def processes_of(uids: range | set[int]) -> list[int]:
    """Live (not zombie) pids whose real or effective uid is in `uids`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                for line in handle:
                    if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                        break
                    if line.startswith("Uid:"):
                        real, effective = (int(value) for value in line.split()[1:3])
                        if real in uids or effective in uids:
                            found.append(int(entry))
                        break
        except (OSError, ValueError):
            continue
    return found


def kill_processes_of(uids: range | set[int], timeout_s: float = 5.0) -> int:
    """SIGKILL every process owned by `uids` until none is left; returns how many were killed."""
    killed = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = processes_of(uids)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return killed


def task_count(uid: int) -> int:
    """Processes and threads of `uid` (what RLIMIT_NPROC counts against)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields["Threads"])
        except (OSError, ValueError, KeyError):
            continue
    return total
