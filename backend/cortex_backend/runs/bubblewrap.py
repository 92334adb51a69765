"""The run's view of the host, as bubblewrap (`bwrap`) arguments.

A run starts from an empty root and sees only what it needs, read-only: the system directories
(/usr, /etc less the backend's own files there, and the merged-/usr links), the Python runtime that runs it, /sys, its staged models.
Writable: its own work dir, and private, size-capped tmpfs mounts for /tmp, /dev/shm and /var/tmp.
/run is an empty tmpfs, so no host socket directory (/run, /var/run, /run/lock, /run/user) is visible;
a unix socket some host process listens on inside a tree that is bound (a runtime, /etc) is covered by
/dev/null (connecting is refused), as the kernel lists them in /proc/net/unix when the run starts;
$HOME, the backend's data dir and every other run's work dir are simply absent. The root itself is
remounted read-only at the end. New network, PID, IPC, UTS, cgroup and user namespaces; the run may not
create further user namespaces, and dies with its supervisor.

bubblewrap is made for exactly this (Flatpak's sandbox), works without root, and replaces mount code of
our own, which had to list what to hide; here everything not listed is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

# Top-level directories of a Debian-like root a program needs; on merged-/usr hosts most are symlinks.
SYSTEM_DIRS = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# GPU device nodes every CUDA process opens besides /dev/nvidiaN of its own GPUs.
NVIDIA_CONTROL_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
    "/dev/nvidia-caps",
)
RUN_HOSTNAME = "cortex-run"
# Folders under /etc the docs once suggested for the backend's own files (TLS keys): never shown to a run.
BACKEND_ETC_DIRS = ("/etc/cortex", "/etc/cortex-nb")


def system_layout(root: str = "/") -> list[str]:
    """Read-only binds (or the same symlinks) for the host's system directories."""
    args: list[str] = []
    for name in SYSTEM_DIRS:
        path = os.path.join(root, name)
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), "/" + name]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, "/" + name]
    return args


def _outermost(paths: list[str]) -> list[str]:
    """Drop paths inside another listed path (binding the outer one shows them already)."""
    ordered = sorted(set(paths))
    kept: list[str] = []
    for path in ordered:
        if not any(path == outer or path.startswith(outer.rstrip("/") + "/") for outer in kept):
            kept.append(path)
    return kept


def _under_any(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def sandbox_arguments(
    *,
    workdir: str,
    sandbox_workdir: str,
    runtime_paths: list[str],
    hide_paths: list[str],
    world_writable: list[str],
    models: dict[str, str],
    tmp_bytes: int,
    gpu_indices: list[int],
    disable_userns: bool = True,
    hidden_etc: list[str] | None = None,
    host_sockets: list[str] | None = None,
) -> list[str]:
    """The bwrap command line up to (not including) '--' and the command. `host_sockets`: the unix
    socket paths to cover (default: those the host listens on now)."""
    args = [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        RUN_HOSTNAME,
    ]
    if disable_userns:
        args.append("--disable-userns")
    args += system_layout()
    args += ["--ro-bind", "/sys", "/sys", "--proc", "/proc", "--dev", "/dev"]
    for index in gpu_indices:
        args += ["--dev-bind-try", f"/dev/nvidia{index}", f"/dev/nvidia{index}"]
    if gpu_indices:
        for node in NVIDIA_CONTROL_NODES:
            args += ["--dev-bind-try", node, node]
    # Private scratch space first: a runtime that lives under /tmp (a CI checkout) is bound on top of it.
    for target in ("/tmp", "/dev/shm", "/var/tmp"):
        args += ["--size", str(tmp_bytes), "--tmpfs", target]
    args += ["--size", "65536", "--tmpfs", "/run", "--symlink", "../run", "/var/run"]
    runtime = [path for path in _outermost(runtime_paths) if not _under_any(path, ["/usr", "/etc"])]
    for path in runtime:
        args += ["--ro-bind", path, path]
    visible = ["/usr", "/etc", *runtime]
    # What must stay unseen even where it lies inside something bound (a data dir inside a runtime tree).
    for path in _outermost([*hide_paths, *world_writable]):
        if _under_any(path, visible) and os.path.isdir(path):
            args += ["--size", "4096", "--tmpfs", path]
    args += hide_arguments(hidden_etc or [])
    covered = [path for path in [*hide_paths, *world_writable] if _under_any(path, visible)] + (
        hidden_etc or []
    )
    sockets = listening_socket_paths() if host_sockets is None else host_sockets
    for path in sockets:
        if _under_any(path, [*visible, "/sys"]) and not _under_any(path, covered):
            args += ["--ro-bind", "/dev/null", path]
    args += ["--bind", workdir, sandbox_workdir]
    for name, path in models.items():
        args += ["--ro-bind", path, str(Path(sandbox_workdir) / "models" / name)]
    args += ["--remount-ro", "/", "--chdir", sandbox_workdir]
    return args


def listening_socket_paths(table: str = "/proc/net/unix") -> list[str]:
    """The filesystem paths of the unix sockets bound in this network namespace (abstract ones, named
    with a leading '@', are out of reach already: a run has a network namespace of its own)."""
    paths: set[str] = set()
    try:
        with open(table, encoding="utf-8", errors="replace") as lines:
            next(lines, None)
            for line in lines:
                fields = line.split(maxsplit=7)
                if len(fields) == 8 and fields[7].startswith("/"):
                    paths.add(fields[7].rstrip("\n"))
    except OSError:
        return []
    return sorted(path for path in paths if os.path.lexists(path))


def private_etc_entries(backend_uid: int, root: str = "/etc") -> list[str]:
    """What under /etc a run must not read although the host's /etc is bound: the backend's own folders
    (/etc/cortex), and for a backend that is not root (whose runs have its uid and groups) every entry
    its user owns or may read only through its uid or groups. A root backend's runs have uids of their
    own, which read only what everyone may."""
    hidden = [path for path in BACKEND_ETC_DIRS if os.path.lexists(path)] if root == "/etc" else []
    if backend_uid == 0:
        return hidden
    todo = [root]
    while todo:
        folder = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if _under_any(entry.path, hidden):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.is_symlink():
                continue
            private = info.st_uid == backend_uid or (
                not info.st_mode & 0o004 and os.access(entry.path, os.R_OK, follow_symlinks=False)
            )
            if private:
                hidden.append(entry.path)
            elif entry.is_dir(follow_symlinks=False):
                todo.append(entry.path)
    return sorted(hidden)


def hide_arguments(paths: list[str]) -> list[str]:
    """bwrap options that cover each path: an empty tmpfs over a folder, /dev/null over anything else."""
    args: list[str] = []
    for path in _outermost(paths):
        if os.path.isdir(path) and not os.path.islink(path):
            args += ["--size", "4096", "--tmpfs", path]
        elif os.path.lexists(path):
            args += ["--ro-bind", "/dev/null", path]
    return args


def world_writable_dirs(max_depth: int = 3) -> list[str]:
    """World-writable directories near the top of the host's tree (/tmp, /var/tmp, /run/lock, ...).

    A run sees none of them as the host has them: each visible one gets a private tmpfs. The walk stays
    shallow (a few hundred directories) so start-up stays fast.
    """
    found: list[str] = []
    todo: list[tuple[str, int]] = [("/", 0)]
    skip = {"/proc", "/sys", "/dev"}
    while todo:
        folder, depth = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if not entry.is_dir(follow_symlinks=False) or entry.path in skip:
                    continue
                if entry.stat(follow_symlinks=False).st_mode & 0o002:
                    found.append(entry.path)
                    continue
            except OSError:
                continue
            if depth + 1 < max_depth:
                todo.append((entry.path, depth + 1))
    return sorted(found)
