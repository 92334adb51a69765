"""Per-run control groups: limits on a whole run (all its processes together), its real peak memory,
whether the kernel's OOM killer or the process limit stopped it, and a way to kill exactly its processes.

cgroup v2 is used for each controller the host delegates to this backend; on a hybrid host (v1
controllers next to an empty v2 tree) the v1 hierarchy of a controller fills in. The v2 tree alone,
even without controllers, still gives membership and `cgroup.kill`. Where nothing is writable (an
unprivileged backend without delegation) `detect` says so and the run report names what is unenforced.

Layout: DIR/cortex-nb-<backend id>/run-<id> under this process's own cgroup in each hierarchy, so two
backends on one host never touch each other's runs, and a restarted backend finds its own leftovers.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("cortex_backend.runs")

CONTROLLERS = ("memory", "pids", "cpu")
# cgroup v1 cpu.shares that equals v2's default cpu.weight of 100.
V1_SHARES_PER_WEIGHT = 1024 / 100


def _mounts() -> tuple[Path | None, dict[str, Path]]:
    """The cgroup2 mount point and each v1 controller's mount point."""
    v2: Path | None = None
    v1: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None, {}
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount_point, fstype, options = Path(fields[4]), tail[0], tail[2].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = mount_point
        elif fstype == "cgroup":
            for controller in CONTROLLERS:
                if controller in options:
                    v1.setdefault(controller, mount_point)
    return v2, v1


def _own_paths() -> dict[str, str]:
    """This process's cgroup per hierarchy: '' for v2, else each v1 controller name."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                own[""] = path
            for controller in controllers.split(","):
                if controller in CONTROLLERS:
                    own[controller] = path
    return own


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text in ("", "max") else int(text)


def _read_keyed(path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[key] = int(value)
    return values


@dataclass
class CgroupSupport:
    """Where this backend may create run cgroups, and which controller each limit uses."""

    v2_parent: Path | None = None
    # controller -> "v2" or the v1 parent directory that carries it
    controllers: dict[str, str] = field(default_factory=dict)
    v1_parents: dict[str, Path] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    def mechanism(self, controller: str) -> str | None:
        """'cgroup_v2', 'cgroup_v1' or None: how a limit of this kind is enforced per run."""
        kind = self.controllers.get(controller)
        return None if kind is None else f"cgroup_{kind}"

    @property
    def usable(self) -> bool:
        return self.v2_parent is not None or bool(self.v1_parents)

    def describe(self) -> str:
        if not self.usable:
            return "no writable cgroup (" + "; ".join(self.reasons) + ")"
        parts = [f"{name}: {self.mechanism(name) or 'unenforced'}" for name in CONTROLLERS]
        return ", ".join(parts) + ("; membership: cgroup_v2" if self.v2_parent else "")

    def cleanup_stale(self) -> int:
        """Kill what a previous life of this backend left in its run cgroups, and remove them."""
        killed = 0
        names = {child.name for parent in self._parents() for child in parent.glob("run-*")}
        for name in sorted(names):
            group = RunCgroup(self, name)
            killed += group.kill()
            group.remove()
        return killed

    def remove(self) -> None:
        """Remove this backend's parent cgroups (at shutdown, once every run cgroup is gone)."""
        for parent in self._parents():
            with contextlib.suppress(OSError):
                parent.rmdir()

    def _parents(self) -> list[Path]:
        return [path for path in [self.v2_parent, *self.v1_parents.values()] if path is not None]


def detect(backend_id: str) -> CgroupSupport:
    """Find (and create) this backend's parent cgroups; never raises."""
    support = CgroupSupport()
    v2_mount, v1_mounts = _mounts()
    own = _own_paths()
    name = f"cortex-nb-{backend_id}"
    if v2_mount is not None and "" in own:
        base = _v2_base(v2_mount, v2_mount / own[""].lstrip("/"))
        parent = base / name
        try:
            parent.mkdir(exist_ok=True)
            support.v2_parent = parent
            offered = set((base / "cgroup.subtree_control").read_text().split())
            wanted = [controller for controller in CONTROLLERS if controller in offered]
            if wanted:
                _write(parent / "cgroup.subtree_control", " ".join("+" + c for c in wanted))
            enabled = set((parent / "cgroup.subtree_control").read_text().split())
            for controller in CONTROLLERS:
                if controller in enabled:
                    support.controllers[controller] = "v2"
        except OSError as exc:
            support.reasons.append(f"cgroup v2 at {base}: {exc.strerror or exc}")
    elif v2_mount is None:
        support.reasons.append("no cgroup2 mount")
    for controller in CONTROLLERS:
        if controller in support.controllers:
            continue
        mount = v1_mounts.get(controller)
        if mount is None or controller not in own:
            continue
        parent = mount / own[controller].lstrip("/") / name
        try:
            parent.mkdir(exist_ok=True)
            probe = parent / "run-probe"
            probe.mkdir(exist_ok=True)
            probe.rmdir()
        except OSError as exc:
            support.reasons.append(f"cgroup v1 {controller}: {exc.strerror or exc}")
            continue
        support.v1_parents[controller] = parent
        support.controllers[controller] = "v1"
    missing = [controller for controller in CONTROLLERS if controller not in support.controllers]
    if missing and not support.reasons:
        support.reasons.append(f"the host offers no {', '.join(missing)} controller to this backend")
    return support


def _v2_base(mount: Path, own: Path) -> Path:
    """Where to put this backend's run cgroups in the v2 tree: its own cgroup, unless that offers no
    controller to children (a cgroup holding processes cannot) while a writable ancestor does, as a
    systemd user session's delegated slice or the root of a pure v2 host does for a root backend."""
    if set(CONTROLLERS) <= set(_read_words(own / "cgroup.subtree_control")):
        return own
    best, best_count = own, len(set(CONTROLLERS) & set(_read_words(own / "cgroup.subtree_control")))
    current = own
    while current != mount:
        current = current.parent
        if not os.access(current, os.W_OK) or not os.access(current / "cgroup.procs", os.W_OK):
            break  # moving a run there needs write access to the common ancestor's cgroup.procs
        count = len(set(CONTROLLERS) & set(_read_words(current / "cgroup.subtree_control")))
        if count > best_count:
            best, best_count = current, count
    return best


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


@dataclass
class RunLimits:
    memory_bytes: int | None
    processes: int | None
    cpu_weight: int | None


class RunCgroup:
    """One run's cgroups (one per hierarchy that carries a controller, plus v2 for membership)."""

    def __init__(self, support: CgroupSupport, name: str, paths: dict[str, Path] | None = None) -> None:
        self.support = support
        self.name = name
        if paths is None:
            paths = {}
            if support.v2_parent is not None:
                paths["v2"] = support.v2_parent / name
            for controller, parent in support.v1_parents.items():
                paths[controller] = parent / name
        self.paths = paths

    def create(self, limits: RunLimits) -> dict[str, str]:
        """Make the cgroups and set the limits; returns how each limit is enforced (absent: not at all)."""
        enforced: dict[str, str] = {}
        for path in self.paths.values():
            path.mkdir(exist_ok=True)
        v2 = self.paths.get("v2")
        support = self.support
        if limits.memory_bytes:
            if support.controllers.get("memory") == "v2" and v2 is not None:
                _write(v2 / "memory.max", str(limits.memory_bytes))
                with contextlib.suppress(OSError):
                    _write(v2 / "memory.swap.max", "0")
                enforced["memory"] = "cgroup_v2"
            elif "memory" in self.paths:
                memory = self.paths["memory"]
                _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
                with contextlib.suppress(OSError):  # absent without swap accounting
                    _write(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
                enforced["memory"] = "cgroup_v1"
        if limits.processes:
            if support.controllers.get("pids") == "v2" and v2 is not None:
                _write(v2 / "pids.max", str(limits.processes))
                enforced["processes"] = "cgroup_v2"
            elif "pids" in self.paths:
                _write(self.paths["pids"] / "pids.max", str(limits.processes))
                enforced["processes"] = "cgroup_v1"
        if limits.cpu_weight:
            if support.controllers.get("cpu") == "v2" and v2 is not None:
                _write(v2 / "cpu.weight", str(limits.cpu_weight))
                enforced["cpu"] = "cgroup_v2"
            elif "cpu" in self.paths:
                _write(
                    self.paths["cpu"] / "cpu.shares",
                    str(max(2, int(limits.cpu_weight * V1_SHARES_PER_WEIGHT))),
                )
                enforced["cpu"] = "cgroup_v1"
        return enforced

    def procs_files(self) -> list[str]:
        """The files a process writes its pid to, to join every one of the run's cgroups."""
        return [str(path / "cgroup.procs") for path in self.paths.values()]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.paths.values():
            with contextlib.suppress(OSError, ValueError):
                found.update(int(line) for line in (path / "cgroup.procs").read_text().split())
        return found

    def peak_memory_bytes(self) -> int | None:
        v2 = self.paths.get("v2")
        if self.support.controllers.get("memory") == "v2" and v2 is not None:
            return _read_int(v2 / "memory.peak")
        if "memory" in self.paths:
            return _read_int(self.paths["memory"] / "memory.max_usage_in_bytes")
        return None

    def cpu_seconds(self) -> float | None:
        """CPU time of every process the run ever had (v2 keeps it even without the cpu controller)."""
        v2 = self.paths.get("v2")
        if v2 is None:
            return None
        usage = _read_keyed(v2 / "cpu.stat").get("usage_usec")
        return None if usage is None else usage / 1e6

    def out_of_memory(self) -> bool:
        """Whether the memory limit made the kernel kill a process of the run."""
        v2 = self.paths.get("v2")
        if self.support.controllers.get("memory") == "v2" and v2 is not None:
            return _read_keyed(v2 / "memory.events").get("oom_kill", 0) > 0
        if "memory" in self.paths:
            return _read_keyed(self.paths["memory"] / "memory.oom_control").get("oom_kill", 0) > 0
        return False

    def process_limit_hit(self) -> bool:
        v2 = self.paths.get("v2")
        if self.support.controllers.get("pids") == "v2" and v2 is not None:
            return _read_keyed(v2 / "pids.events").get("max", 0) > 0
        if "pids" in self.paths:
            return _read_keyed(self.paths["pids"] / "pids.events").get("max", 0) > 0
        return False

    def kill(self, timeout_s: float = 5.0) -> int:
        """SIGKILL every process in the run's cgroups until none is left; returns how many were signalled."""
        killed = 0
        v2 = self.paths.get("v2")
        if v2 is not None and (v2 / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                if self.pids():
                    _write(v2 / "cgroup.kill", "1")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
            time.sleep(0.02)
        return killed

    def remove(self) -> None:
        for path in self.paths.values():
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        log.warning("could not remove cgroup %s: %s", path, exc)
                        break
                    time.sleep(0.02)  # the last process is still being torn down
