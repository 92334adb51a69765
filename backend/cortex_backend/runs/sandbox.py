"""The sandbox supervisor: the program the backend starts for each source run.

    python -I -S .../cortex_backend/runs/sandbox.py CONFIG_JSON STATUS_FD

It puts the run in new network, mount, PID, IPC and UTS namespaces (one `unshare`, plus a user
namespace when the backend is not root), hides the backend's data dir, gives the run a private /tmp,
a fresh /proc and its models read-only, drops to the run's own uid, applies rlimits and starts the
command. It reports JSON lines on STATUS_FD: `started` (with the isolation it got), then `exit` (exit
code, signal, peak memory, CPU seconds), or `setup_failed` (code + message) before any user code ran.

Process containment: with a PID namespace this supervisor's child is the namespace's init; when the
command exits or the run is stopped, everything left in the namespace is killed, so no process the run
started (double forks and `setsid` daemons included) outlives it. Without namespaces the supervisor is
a child subreaper: orphans are re-parented to it and it kills every descendant it can see in /proc.

This module runs as its own small process, started by path: it imports nothing but the standard library.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import time
import traceback
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

# The uid the command has inside a user namespace (non-root backends): not 0, so exec drops every capability.
USERNS_UID = 1000
POLL_S = 0.05

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def encode(value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    _check(_libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)), f"mount {target}")


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


# namespaces ---------------------------------------------------------------------------------------
def enter_namespaces(as_root: bool) -> None:
    """One unshare for network, mount, PID, IPC and UTS, plus a user namespace when not root."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if as_root:
        unshare(flags)
        return
    uid, gid = os.getuid(), os.getgid()
    unshare(flags | CLONE_NEWUSER)
    with open("/proc/self/setgroups", "w") as handle:
        handle.write("deny")
    with open("/proc/self/uid_map", "w") as handle:
        handle.write(f"{USERNS_UID} {uid} 1")
    with open("/proc/self/gid_map", "w") as handle:
        handle.write(f"{USERNS_UID} {gid} 1")


def _first_closed_ancestor(path: str) -> str | None:
    """The topmost directory on the way to `path` that other users may not traverse (e.g. /root)."""
    current = "/"
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return current
    return None


def expose_runtime(paths: list[str]) -> None:
    """Make the Python runtime reachable by the run's uid when it lives under a closed directory.

    The closed directory is covered by an empty tmpfs (so the rest of it stays hidden) and only the
    runtime directories are bound back into it, read-only, at their usual paths.
    """
    groups: dict[str, list[tuple[str, int]]] = {}
    for path in paths:
        closed = _first_closed_ancestor(path)
        if closed is not None:
            groups.setdefault(closed, []).append((path, os.open(path, os.O_PATH | os.O_DIRECTORY)))
    for closed, items in groups.items():
        mount("tmpfs", closed, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        for path, fd in items:
            if any(path != other and path.startswith(other.rstrip("/") + "/") for other, _ in items):
                os.close(fd)
                continue  # inside another runtime path bound here already
            os.makedirs(path, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            os.close(fd)
        mount(None, closed, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def setup_mounts(config: dict[str, Any]) -> dict[str, str]:
    """Inside the new mount namespace: hide, give a private /tmp and /proc, bind the work dir and models."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    work_fd = os.open(config["workdir"], os.O_PATH | os.O_DIRECTORY)
    model_fds = {name: os.open(path, os.O_PATH | os.O_DIRECTORY) for name, path in config["models"].items()}
    tiers = {"filesystem": "mountns"}
    try:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        tiers["proc"] = "private"
    except OSError:
        tiers["proc"] = "host"
    for path in config["hide_paths"]:
        if os.path.isdir(path) and not os.path.islink(path):
            mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=000")
        elif os.path.isfile(path):
            mount("/dev/null", path, None, MS_BIND)
    if config.get("uid") is not None:
        expose_runtime(config["runtime_paths"])
    # A Python environment living under /tmp (a CI checkout, say) must survive the private /tmp below.
    under_tmp = [path for path in config["runtime_paths"] if path == "/tmp" or path.startswith("/tmp/")]
    tmp_runtime_fds = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in under_tmp]
    if os.path.isdir("/dev/shm"):
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={config['tmp_bytes']},mode=1777")
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={config['tmp_bytes']},mode=1777")
    for path, fd in tmp_runtime_fds:
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    target = config["sandbox_workdir"]
    os.makedirs(target, mode=0o755, exist_ok=True)
    mount(f"/proc/self/fd/{work_fd}", target, None, MS_BIND)
    for name, fd in model_fds.items():
        model_target = os.path.join(target, "models", name)
        mount(f"/proc/self/fd/{fd}", model_target, None, MS_BIND | MS_REC)
        mount(None, model_target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    os.close(work_fd)
    return tiers


def link_models(config: dict[str, Any]) -> None:
    """Without a mount namespace models are symlinks (read-only only as far as file modes go)."""
    for name, path in config["models"].items():
        link = os.path.join(config["workdir"], "models", name)
        if os.path.isdir(link) and not os.listdir(link):
            os.rmdir(link)
        if not os.path.lexists(link):
            os.symlink(path, link)


# the command ----------------------------------------------------------------------------------------
def limit_child(limits: dict[str, Any]) -> None:
    """Runs in the command's process just before exec (after the uid switch)."""
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
                stat = handle.read().decode(errors="replace")
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
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


class Supervisor:
    """Starts the command, reaps every child, and kills whatever is left when it ends or is stopped."""

    def __init__(self, config: dict[str, Any], reporter: Reporter, in_pidns: bool) -> None:
        self.config = config
        self.reporter = reporter
        self.in_pidns = in_pidns
        self.stop_requested = False
        self.main_pid: int | None = None
        self.main_status: int | None = None

    def request_stop(self, *_: Any) -> None:
        self.stop_requested = True

    def signal_all(self, sig: int) -> None:
        if self.in_pidns:
            # As the namespace's init, kill(-1) reaches every other process in it.
            try:
                os.kill(-1, sig)
            except ProcessLookupError:
                pass
            return
        if self.main_pid is not None:
            try:
                os.killpg(self.main_pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

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

    def run(self, cwd: str, isolation: dict[str, str]) -> int:
        config = self.config
        signal.signal(signal.SIGTERM, self.request_stop)
        uid, gid = config.get("uid"), config.get("gid")
        env = {**config["env"], "HOME": cwd, "PWD": cwd}
        try:
            process = subprocess.Popen(
                config["argv"], cwd=cwd, env=env, stdin=subprocess.DEVNULL, close_fds=True,
                start_new_session=True, preexec_fn=lambda: limit_child(config["limits"]),
                user=uid, group=gid, extra_groups=[] if uid is not None else None,
            )
        except OSError as exc:
            if exc.filename == cwd:
                self.reporter.send("setup_failed", code="sandbox_failed", message=(
                    f"the run's uid cannot enter its work dir {cwd} ({exc.strerror}); enable namespaces or point"
                    " --runs-workspace at a directory whose parents everyone may traverse"))
                return 0
            self.reporter.send("started", isolation=isolation, pid=None)
            self.reporter.send("exit", exit_code=127, signal=None, error=f"could not start the command: {exc}",
                               max_rss_bytes=0, cpu_seconds=0.0, stopped=False)
            return 0
        self.main_pid = process.pid
        self.reporter.send("started", isolation=isolation, pid=process.pid)
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
            if not self.reap() and (self.in_pidns or not descendants(os.getpid())):
                break
            time.sleep(POLL_S)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        status = self.main_status if self.main_status is not None else 0
        self.reporter.send(
            "exit",
            exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            max_rss_bytes=int(children.ru_maxrss) * 1024,
            cpu_seconds=round(children.ru_utime + children.ru_stime, 3),
            stopped=self.stop_requested,
        )
        return 0


def prepare_and_run(config: dict[str, Any], reporter: Reporter, in_pidns: bool, user_tier: str) -> int:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    isolation = {"network": "none", "filesystem": "none", "proc": "host", "processes": "subreaper", "user": user_tier}
    if in_pidns:
        isolation.update(network="netns", processes="pidns", **setup_mounts(config))
        cwd = config["sandbox_workdir"]
    else:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        link_models(config)
        cwd = config["workdir"]
    if user_tier == "userns":
        config = {**config, "uid": None, "gid": None}
    return Supervisor(config, reporter, in_pidns).run(cwd, isolation)


def main(argv: list[str]) -> int:
    with open(argv[1]) as handle:
        config = json.load(handle)
    reporter = Reporter(int(argv[2]))
    # Die with the backend: a run never outlives the service that watches it.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != config["backend_pid"]:
        return 1
    as_root = os.geteuid() == 0
    if as_root:
        user_tier = "dedicated_uid" if config.get("uid") is not None else "root"
    else:
        user_tier = "same_uid"
    namespace_error = "namespaces are turned off on this backend (--run-namespaces off)"
    in_namespaces = False
    if config["namespaces"]:
        try:
            enter_namespaces(as_root)
            in_namespaces = True
            if not as_root:
                user_tier = "userns"
        except OSError as exc:
            namespace_error = f"this host does not allow new namespaces here ({exc})"
    if not in_namespaces and config["require_isolation"]:
        reporter.send("setup_failed", code="isolation_unsupported", message=(
            f"the spec says isolation: required, but {namespace_error}; the run needs a network namespace."
            " Use isolation: best_effort to run without one"))
        return 0
    if not in_namespaces:
        return _guarded(prepare_and_run, config, reporter, False, user_tier)
    child = os.fork()
    if child == 0:
        os._exit(_guarded(prepare_and_run, config, reporter, True, user_tier))
    signal.signal(signal.SIGTERM, lambda *_: _forward(child, signal.SIGTERM))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            status = 0
            break
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        reporter.send("setup_failed", code="sandbox_failed", message=f"the sandbox's init process ended with status {status}")
    return 0


def _forward(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _guarded(function, *args: Any) -> int:
    reporter: Reporter = args[1]
    try:
        return function(*args)
    except BaseException as exc:  # report, never hang: the backend waits for an event
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        reporter.send("setup_failed", code="sandbox_failed", message=f"the sandbox could not be set up: {detail}")
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
