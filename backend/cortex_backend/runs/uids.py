"""The unprivileged uids runs execute as when the backend is root: one per concurrent run.

A uid of its own means a run cannot signal or read another run's processes or files, and its process
limit counts only its own processes. Each uid is claimed for the backend's whole life with a host-wide
lock (an flock on LOCK_DIR/<uid>.lock), so two root backends on one host never share a uid, and one
never kills what another runs. A uid goes back into the pool only once nothing of its last run is left:
no process owned by it and no file of it in the work dir; otherwise it stays out (quarantined).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import time
from pathlib import Path

log = logging.getLogger("cortex_backend.runs")

LOCK_DIR = Path("/run/cortex-nb/run-uids")
# How far past `base` to look for free uids before giving up.
SEARCH_SPAN = 1 << 16


class UidPoolExhausted(RuntimeError):
    pass


class UidPool:
    """`size` uids at or above `base`, each held with a host-wide lock for as long as this pool lives."""

    def __init__(self, base: int, size: int, lock_dir: Path = LOCK_DIR) -> None:
        self.base = base
        self.size = size
        self.lock_dir = lock_dir
        self._locks: dict[int, int] = {}
        self._free: list[int] = []
        self._taken: set[int] = set()
        self._quarantined: set[int] = set()

    def claim(self) -> list[int]:
        """Lock `size` uids that no other backend holds and that own no live process; returns them."""
        self.lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.lock_dir, 0o700)
        for uid in range(self.base, self.base + SEARCH_SPAN):
            if len(self._locks) >= self.size:
                break
            fd = os.open(self.lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # another backend's
            leftovers = processes_of({uid})
            if leftovers:
                # Not ours to kill: whoever held this uid before may not be a cortex-nb backend.
                log.warning(
                    "uid %d still owns process(es) %s; leaving it out of the run pool", uid, leftovers[:5]
                )
                os.close(fd)
                continue
            self._locks[uid] = fd
            self._free.append(uid)
        if len(self._locks) < self.size:
            raise UidPoolExhausted(
                f"found only {len(self._locks)} free run uid(s) from {self.base}; need {self.size}"
            )
        return sorted(self._locks)

    def close(self) -> None:
        for fd in self._locks.values():
            os.close(fd)
        self._locks.clear()
        self._free.clear()

    @property
    def uids(self) -> list[int]:
        return sorted(self._locks)

    def acquire(self) -> int:
        if not self._free:
            raise UidPoolExhausted(
                "every run uid is taken or quarantined; the pool is as large as the device slots"
            )
        uid = self._free.pop(0)
        self._taken.add(uid)
        return uid

    def release(self, uid: int, clean: bool) -> None:
        """Hand `uid` back for the next run, or keep it out when its last run left something behind."""
        self._taken.discard(uid)
        if clean:
            self._free.append(uid)
        else:
            self._quarantined.add(uid)
            log.error("run uid %d is quarantined: its last run left processes or files behind", uid)

    def retry_quarantined(self, is_clean) -> None:
        for uid in sorted(self._quarantined):
            if is_clean(uid):
                self._quarantined.discard(uid)
                self._free.append(uid)

    def __contains__(self, uid: int) -> bool:
        return uid in self._locks


def processes_of(uids: set[int]) -> list[int]:
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


def kill_processes_of(uids: set[int], timeout_s: float = 5.0) -> int:
    """SIGKILL every process owned by `uids` (uids this backend holds the lock of) until none is left."""
    killed = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = processes_of(uids)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.05)
    return killed


def files_owned_by(uid: int, roots: list[str], max_depth: int = 3) -> list[str]:
    """Paths owned by `uid` under `roots` (shared writable places such as /tmp), at most `max_depth`
    levels down, outermost first."""
    found: list[str] = []
    todo = [(root, 0) for root in roots]
    while todo:
        folder, depth = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                owner = entry.stat(follow_symlinks=False).st_uid
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if owner == uid:
                found.append(entry.path)
            elif is_dir and depth + 1 < max_depth:
                todo.append((entry.path, depth + 1))
    return found


def remove_files_of(uid: int, roots: list[str]) -> bool:
    """Delete what `uid` left in `roots`; True when nothing of it is left there."""
    for path in files_owned_by(uid, roots):
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
    return not files_owned_by(uid, roots)


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
