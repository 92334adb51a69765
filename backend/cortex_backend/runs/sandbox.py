"""The sandbox supervisor: the program the backend starts for each source run.

    python -I -S .../cortex_backend/runs/sandbox.py CONFIG_JSON STATUS_FD

With a sandbox (the default where the host allows it) the command runs under bubblewrap with the
arguments the backend built (runs/bubblewrap.py: a minimal read-only root, private /tmp, /dev/shm and
/var/tmp, only its work dir writable, new network, PID, IPC, UTS and user namespaces). Before bubblewrap
starts, this supervisor puts it into the run's cgroups, applies rlimits and, on a root backend, drops to
the run's own uid; bubblewrap then runs unprivileged, so nothing the run does happens as root.

A root backend's runtime or work dir may lie under a directory the run's uid may not enter (/root, a
0700 data dir): in a private mount namespace of its own the supervisor covers such a directory with an
empty tmpfs and binds back only those paths, so bubblewrap (as the run's uid) can reach them.

It reports JSON lines on STATUS_FD: `started` (with the isolation the run got), then `exit` (exit code,
signal, peak memory, CPU seconds, a limit the run passed), or `setup_failed` (code + message) before any
user code ran. Stopping (SIGTERM) signals the run's processes, then after the grace period kills the
PID namespace's init, which ends every process of the run (double forks and `setsid` daemons too).

Without a sandbox (`--run-namespaces off`, or a host where bubblewrap cannot run, with isolation:
best_effort) the supervisor is a child subreaper and kills every descendant it can see in /proc.

This module runs as its own small process, started by path: it imports nothing but the standard library.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import select
import signal
import stat
import subprocess
import sys
import time
import traceback
from typing import Any

CLONE_NEWNS = 0x00020000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

# keyctl(2): its syscall number per architecture, and KEYCTL_JOIN_SESSION_KEYRING with no name (a new,
# anonymous session keyring).
KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219, "ppc64le": 283, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING = 1

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

POLL_S = 0.05
# How often the work dir's size is summed when the disk quota is watched.
DISK_WATCH_S = 0.25
MEMORY_WATCH_S = 0.05
# The sandbox's private tmpfs mounts: memory too, so a watched memory limit counts what they hold.
SANDBOX_TMPFS = ("tmp", "dev/shm", "var/tmp")
# Runs inside the sandbox just before the command: tells the supervisor the sandbox is up.
STARTED_MARK = 'printf started >&{fd}; exec {fd}>&-; exec "$@"'

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def new_session_keyring() -> None:
    """Leave the backend's session keyring for a fresh, empty one: otherwise a run inherits it and can
    read (and add) the keys the backend's login holds. Where keyctl is unknown or blocked (a container's
    seccomp profile), the run cannot use it either."""
    number = KEYCTL_SYSCALL.get(os.uname().machine)
    if number is not None:
        _libc.syscall(ctypes.c_long(number), ctypes.c_int(KEYCTL_JOIN_SESSION_KEYRING), None)


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def encode(value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    _check(
        _libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)),
        f"mount {target}",
    )


class Reporter:
    """JSON lines to the backend on the status pipe (never on stdout/stderr: those are the run's logs)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, event: str, **fields: Any) -> None:
        line = (json.dumps({"event": event, **fields}) + "\n").encode()
        try:
            os.write(self.fd, line)
        except OSError:
            pass


# reaching closed paths (root backends) ------------------------------------------------------------
def _first_closed_ancestor(path: str) -> str | None:
    """The topmost directory on the way to `path` that other users may not traverse (e.g. /root)."""
    current = "/"
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return current
    return None


def expose_paths(paths: list[tuple[str, bool]]) -> None:
    """In this process's own mount namespace, make each (path, writable) reachable by any uid.

    A closed ancestor is covered by an empty tmpfs (so the rest of it stays hidden) and only the listed
    paths are bound back at their usual place; the host's view is untouched.
    """
    unshare(CLONE_NEWNS)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    groups: dict[str, list[tuple[str, bool, int]]] = {}
    for path, writable in paths:
        closed = _first_closed_ancestor(path)
        if closed is not None:
            groups.setdefault(closed, []).append((path, writable, os.open(path, os.O_PATH)))
    for closed, items in groups.items():
        mount("tmpfs", closed, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        for path, writable, fd in items:
            if any(path != other and path.startswith(other.rstrip("/") + "/") for other, _, _ in items):
                os.close(fd)
                continue  # inside another path bound here already
            os.makedirs(path, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            if not writable:
                mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            os.close(fd)
        mount(None, closed, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def link_models(config: dict[str, Any]) -> None:
    """Without a sandbox models are symlinks (read-only only as far as file modes go)."""
    for name, path in config["models"].items():
        link = os.path.join(config["workdir"], "models", name)
        if os.path.isdir(link) and not os.listdir(link):
            os.rmdir(link)
        if not os.path.lexists(link):
            os.symlink(path, link)


# the run's first process ----------------------------------------------------------------------------
def enter_run(config: dict[str, Any]) -> None:
    """Runs in the child just before exec: cgroups (as root, before the uid drop), rlimits, uid."""
    for procs in config.get("cgroup_procs", []):
        with open(procs, "w") as handle:
            handle.write("0")
    limits = config["limits"]
    address_space = limits.get("address_space_bytes")
    if address_space:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    file_size = limits["file_size_bytes"]
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    processes = limits["processes"]
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    cpu = limits["cpu_seconds"]
    # SIGXCPU at the soft limit, SIGKILL a little later.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    uid, gid = config.get("uid"), config.get("gid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    new_session_keyring()  # after the uid drop: the new keyring belongs to the run's uid
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.umask(0o022)


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                text = handle.read().decode(errors="replace")
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = text[text.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    tree = _children_by_parent()
    found, todo = [], list(tree.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(tree.get(child, []))
    return found


def process_tree(pid: int) -> list[int]:
    """`pid`'s descendants through /proc/PID/task/TID/children (cheap: no walk over all of /proc)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{current}/task/{tid}/children") as handle:
                    children = [int(value) for value in handle.read().split()]
            except (OSError, ValueError):
                return descendants(pid)  # no children files on this kernel: walk /proc instead
            found.extend(children)
            todo.extend(children)
    return found


def memfd_bytes(pids: list[int]) -> int:
    """Memory held by the memfds (memfd_create) these processes have open: counted by no mount and, while
    unmapped, by no process's resident size. Each file once, however many processes share it."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if not os.readlink(path).startswith("/memfd:"):
                    continue
                info = os.stat(path)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


def sandbox_memory_bytes(init_pid: int) -> int:
    """What the run holds in memory: its processes' resident pages, their memfds, and what its private
    tmpfs mounts hold."""
    pids = process_tree(init_pid)
    total = resident_bytes(pids) + memfd_bytes([init_pid, *pids])
    for mount_point in SANDBOX_TMPFS:
        try:
            info = os.statvfs(f"/proc/{init_pid}/root/{mount_point}")
        except OSError:
            continue
        total += (info.f_blocks - info.f_bfree) * info.f_frsize
    return total


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def resident_bytes(pids: list[int]) -> int:
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as handle:
                total += int(handle.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


def disk_bytes(root: str) -> int:
    """Bytes allocated under `root` (what the run's files really take on disk)."""
    total = 0
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total


def _rusage_fields() -> dict[str, Any]:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "max_rss_bytes": int(children.ru_maxrss) * 1024,
        "cpu_seconds": round(children.ru_utime + children.ru_stime, 3),
    }


def options_pipe(options: list[str]) -> int:
    """A file descriptor holding `options` NUL-separated, for bwrap's --args (a memfd: no size limit)."""
    fd = os.memfd_create("bwrap-options", 0)
    os.write(fd, b"".join(option.encode() + b"\0" for option in options))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class SandboxedRun:
    """Starts bubblewrap with the command, watches it and the run's limits, and ends it when asked."""

    def __init__(self, config: dict[str, Any], reporter: Reporter) -> None:
        self.config = config
        self.reporter = reporter
        self.stop_requested = False
        self.limit_exceeded: str | None = None
        self.init_pid: int | None = None  # the PID namespace's init, as the host sees it

    def request_stop(self, *_: Any) -> None:
        self.stop_requested = True

    def run(self) -> int:
        config = self.config
        signal.signal(signal.SIGTERM, self.request_stop)
        if config.get("expose_paths"):
            expose_paths([(path, bool(writable)) for path, writable in config["expose_paths"]])
        mark_read, mark_write = os.pipe()
        status_read, status_write = os.pipe()
        # Every option goes through a pipe (--args), not the command line: the PID namespace's init is a
        # copy of bwrap, and a run reading its /proc/1/cmdline would see the host paths of every bind.
        options = [*config["bwrap_args"], "--json-status-fd", str(status_write)]
        args_fd = options_pipe(options)
        argv = [
            config["bwrap"],
            "--args",
            str(args_fd),
            "--",
            "/bin/sh",
            "-c",
            STARTED_MARK.format(fd=mark_write),
            "cortex-run",
            *config["argv"],
        ]
        try:
            process = subprocess.Popen(
                argv,
                cwd="/",
                env=config["env"],
                stdin=subprocess.DEVNULL,
                close_fds=True,
                pass_fds=(mark_write, status_write, args_fd),
                start_new_session=True,
                preexec_fn=lambda: enter_run(config),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self.reporter.send(
                "setup_failed", code="sandbox_failed", message=f"the sandbox could not start: {exc}"
            )
            return 0
        os.close(mark_write)
        os.close(status_write)
        os.close(args_fd)
        started = False
        status_buffer = b""
        exit_status: int | None = None
        stop_deadline: float | None = None
        next_disk = next_memory = 0.0
        readers = [mark_read, status_read]
        while exit_status is None:
            if readers:
                ready, _, _ = select.select(readers, [], [], POLL_S)
            else:
                ready = []
                time.sleep(POLL_S)
            for fd in ready:
                data = os.read(fd, 4096)
                if not data:
                    readers.remove(fd)
                    os.close(fd)
                elif fd == mark_read and not started:
                    started = True
                    self.reporter.send("started", isolation=config["isolation"], pid=self.init_pid)
                elif fd == status_read:
                    status_buffer += data
                    self._read_status(status_buffer)
            pid, status, _ = os.wait4(process.pid, os.WNOHANG)
            if pid:
                exit_status = status
                break
            now = time.monotonic()
            if started and self.limit_exceeded is None:
                if config["watch"].get("disk_bytes") and now >= next_disk:
                    next_disk = now + DISK_WATCH_S
                    if disk_bytes(config["workdir"]) > config["watch"]["disk_bytes"]:
                        self._end_now("disk")
                if config["watch"].get("memory_bytes") and now >= next_memory and self.init_pid:
                    next_memory = now + MEMORY_WATCH_S
                    if sandbox_memory_bytes(self.init_pid) > config["watch"]["memory_bytes"]:
                        self._end_now("memory")
            if self.stop_requested and stop_deadline is None:
                stop_deadline = now + float(config["kill_grace_s"])
                if self.init_pid:
                    _signal(process_tree(self.init_pid), signal.SIGTERM)
                else:
                    _signal([process.pid], signal.SIGKILL)
            if stop_deadline is not None and now >= stop_deadline:
                self._kill_namespace(process.pid)
        if not started:
            self.reporter.send(
                "setup_failed",
                code="sandbox_failed",
                message=(
                    f"the sandbox (bubblewrap) ended with status {_describe(exit_status)} before the command started;"
                    " its message is in the run's logs"
                ),
            )
            return 0
        code = os.WEXITSTATUS(exit_status) if os.WIFEXITED(exit_status) else None
        sig = os.WTERMSIG(exit_status) if os.WIFSIGNALED(exit_status) else None
        # bubblewrap passes a command killed by a signal on as exit code 128 + the signal.
        if code is not None and 128 < code < 128 + 65:
            code, sig = None, code - 128
        self.reporter.send(
            "exit",
            exit_code=code,
            signal=sig,
            stopped=self.stop_requested,
            limit_exceeded=self.limit_exceeded,
            **_rusage_fields(),
        )
        return 0

    def _read_status(self, buffer: bytes) -> None:
        # bubblewrap writes JSON documents one after another; the first names the sandbox's init.
        if self.init_pid is not None:
            return
        text = buffer.decode(errors="replace")
        start = text.find('"child-pid"')
        if start < 0:
            return
        digits = "".join(
            ch for ch in text[start + len('"child-pid"') :].split(",")[0].split("}")[0] if ch.isdigit()
        )
        if digits:
            self.init_pid = int(digits)

    def _end_now(self, limit: str) -> None:
        self.limit_exceeded = limit
        if self.init_pid:
            _signal([self.init_pid], signal.SIGKILL)

    def _kill_namespace(self, bwrap_pid: int) -> None:
        # The namespace's init dying takes every process of the namespace with it.
        _signal([self.init_pid] if self.init_pid else [bwrap_pid], signal.SIGKILL)


def _describe(status: int | None) -> str:
    if status is None:
        return "unknown"
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit code {os.WEXITSTATUS(status)}"


class UnsandboxedRun:
    """No namespaces: the supervisor is a child subreaper and kills every descendant it can see."""

    def __init__(self, config: dict[str, Any], reporter: Reporter) -> None:
        self.config = config
        self.reporter = reporter
        self.stop_requested = False
        self.main_pid: int | None = None
        self.main_status: int | None = None

    def request_stop(self, *_: Any) -> None:
        self.stop_requested = True

    def signal_all(self, sig: int) -> None:
        if self.main_pid is not None:
            try:
                os.killpg(self.main_pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        _signal(descendants(os.getpid()), sig)

    def reap(self) -> bool:
        """Reap exited children; False once there are none left at all."""
        while True:
            try:
                pid, status, _ = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.main_pid:
                self.main_status = status

    def run(self) -> int:
        config = self.config
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        link_models(config)
        cwd = config["workdir"]
        signal.signal(signal.SIGTERM, self.request_stop)
        env = {**config["env"], "HOME": cwd, "PWD": cwd}
        try:
            process = subprocess.Popen(
                config["argv"],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
                preexec_fn=lambda: enter_run(config),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            if getattr(exc, "filename", None) == cwd:
                self.reporter.send(
                    "setup_failed",
                    code="sandbox_failed",
                    message=(
                        f"the run's uid cannot enter its work dir {cwd} ({exc.strerror}); enable the sandbox or point"
                        " --runs-workspace at a directory whose parents everyone may traverse"
                    ),
                )
                return 0
            self.reporter.send("started", isolation=config["isolation"], pid=None)
            self.reporter.send(
                "exit",
                exit_code=127,
                signal=None,
                error=f"could not start the command: {exc}",
                max_rss_bytes=0,
                cpu_seconds=0.0,
                stopped=False,
            )
            return 0
        self.main_pid = process.pid
        self.reporter.send("started", isolation=config["isolation"], pid=process.pid)
        stop_deadline = None
        while self.main_status is None:
            if not self.reap():
                break
            if self.stop_requested and stop_deadline is None:
                self.signal_all(signal.SIGTERM)
                stop_deadline = time.monotonic() + float(config["kill_grace_s"])
            if stop_deadline is not None and time.monotonic() >= stop_deadline:
                self.signal_all(signal.SIGKILL)
            time.sleep(POLL_S)
        # The command is done: whatever it left running goes now.
        for _ in range(400):
            self.signal_all(signal.SIGKILL)
            if not self.reap() and not descendants(os.getpid()):
                break
            time.sleep(POLL_S)
        status = self.main_status if self.main_status is not None else 0
        self.reporter.send(
            "exit",
            exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            stopped=self.stop_requested,
            **_rusage_fields(),
        )
        return 0


def main(argv: list[str]) -> int:
    with open(argv[1]) as handle:
        config = json.load(handle)
    reporter = Reporter(int(argv[2]))
    # Die with the backend: a run never outlives the service that watches it.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != config["backend_pid"]:
        return 1
    runner = SandboxedRun(config, reporter) if config.get("bwrap") else UnsandboxedRun(config, reporter)
    try:
        return runner.run()
    except BaseException as exc:  # report, never hang: the backend waits for an event
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        reporter.send(
            "setup_failed", code="sandbox_failed", message=f"the sandbox could not be set up: {detail}"
        )
        traceback.print_exc(file=sys.stderr)
        return 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -I -S sandbox.py CONFIG_JSON STATUS_FD", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(main(sys.argv))
    except OSError as error:
        if error.errno == errno.EPIPE:
            sys.exit(1)
        raise
