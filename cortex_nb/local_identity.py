"""Is what backend.json names really this user's local backend? Checked before a token is sent or a
signal is given, because the file outlives the backend: after a crash its pid can belong to another
process and its port to another user.

- The state dir must be the user's own and closed to others (0700), or nothing in it is trusted.
- The process: alive, of this uid, started when the state file says (its start time, so a reused pid
  does not match) and running `cortex_backend serve`. Only such a process is ever signalled.
- The listener: where the OS tells (Linux /proc/net/tcp), the socket listening on the URL's port
  belongs to this uid and is held open by that process; and it answers a fresh challenge with the
  proof only the holder of the state file's nonce can give (cortex_nb/protocol/backend_proof.py).

Standard library only: the Jupyter server extension imports this too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

from .errors import CortexError
from .protocol.process_identity import process_start

# What the backend's command line holds (`python -m cortex_backend serve`, `cortex-nb backend serve`).
BACKEND_MARKERS = (("cortex_backend", "serve"), ("cortex-nb", "backend", "serve"))
TCP_LISTEN = "0A"


class LocalDirUnsafe(CortexError):
    """The local backend's state dir could be written by someone else: its state file proves nothing."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="local_dir_unsafe")


def ensure_private_dir(path: Path) -> None:
    """Create `path` as 0700, or check an existing one is a directory of this user that no one else can
    write to (tightened to 0700 then); LocalDirUnsafe otherwise."""
    if not path.exists() and not path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
    info = path.lstat()
    hint = f"use a directory of your own with mode 0700 (CORTEX_LOCAL_DIR, or unset it for {_default_hint()})"
    if not stat.S_ISDIR(info.st_mode):
        raise LocalDirUnsafe(f"the local backend's dir {path} is not a directory (a link?); {hint}")
    if info.st_uid != os.getuid():
        raise LocalDirUnsafe(
            f"the local backend's dir {path} belongs to uid {info.st_uid}, not to you (uid {os.getuid()});"
            f" its backend.json could send your token anywhere. {hint}"
        )
    if info.st_mode & 0o022:
        raise LocalDirUnsafe(
            f"the local backend's dir {path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}):"
            f" anyone could have put a backend.json there. {hint}"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(0o700)  # ours and unwritable by others so far: close it for reading too


def _default_hint() -> str:
    return "$XDG_DATA_HOME/cortex-nb/local"


# the process ---------------------------------------------------------------------------------------
def _process_uid_and_cmdline(pid: int) -> tuple[int, list[str]] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        return uid, cmdline
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    try:
        import psutil

        process = psutil.Process(pid)
        return process.uids().real, process.cmdline()
    except Exception:  # psutil absent, or the process is gone
        return None


def is_backend_process(pid: int, recorded_start: str | None) -> bool:
    """Whether `pid` is the backend that wrote the state file: this user's, started when recorded,
    running `cortex_backend serve`. A state file without a start time never matches."""
    if not recorded_start or pid <= 0:
        return False
    seen = _process_uid_and_cmdline(pid)
    if seen is None:
        return False
    uid, cmdline = seen
    if uid != os.getuid() or process_start(pid) != recorded_start:
        return False
    words = [os.path.basename(part) for part in cmdline]
    return any(all(marker in words for marker in markers) for markers in BACKEND_MARKERS)


# the listener --------------------------------------------------------------------------------------
def _listening_sockets(port: int) -> list[tuple[int, int]] | None:
    """(uid, inode) of every socket listening on `port`, from /proc/net/tcp{,6}; None where unknown."""
    found: list[tuple[int, int]] = []
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.append((int(fields[7]), int(fields[9])))
    return found if readable else None


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def listener_problem(url: str, pid: int) -> str | None:
    """Why the socket listening on `url`'s port is not the backend's (None when it is, or where the OS
    does not say): every listener on it must be of this uid, and one must be held by `pid`."""
    port = urlsplit(url).port
    if port is None:
        return f"{url} names no port"
    sockets = _listening_sockets(port)
    if sockets is None:
        return None
    if not sockets:
        return f"nothing listens on port {port}"
    strangers = sorted({uid for uid, _ in sockets if uid != os.getuid()})
    if strangers:
        return f"port {port} is held by uid {strangers[0]}, not by you (uid {os.getuid()})"
    if not {inode for _, inode in sockets} & _socket_inodes(pid):
        return f"the socket on port {port} is not the backend's (pid {pid})"
    return None
