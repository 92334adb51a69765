"""The run's view of the host, as bubblewrap (`bwrap`) arguments.

A run starts from an empty root and sees only what it needs, read-only: the system directories
(/usr, /etc and the merged-/usr links), the Python runtime that runs it, /sys, its staged models.
Writable: its own work dir, and private, size-capped tmpfs mounts for /tmp, /dev/shm and /var/tmp.
/run is an empty tmpfs, so no host socket directory (/run, /var/run, /run/lock, /run/user) is visible;
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
) -> list[str]:
    """The bwrap command line up to (not including) '--' and the command."""
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
    args += ["--bind", workdir, sandbox_workdir]
    for name, path in models.items():
        args += ["--ro-bind", path, str(Path(sandbox_workdir) / "models" / name)]
    args += ["--remount-ro", "/", "--chdir", sandbox_workdir]
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
