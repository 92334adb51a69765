"""What isolation this host gives source runs, found once at start-up, and what one run will get.

The pieces: the bubblewrap sandbox (filesystem view, network, PID, IPC, UTS and user namespaces), a
dedicated uid per run (root backends), and per-run cgroups (memory, process count, CPU weight). A run's
report lists how each was provided; a spec with `isolation: required` fails with `isolation_unsupported`
before it starts where the sandbox or a per-run memory or process limit is missing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from .bubblewrap import system_layout, world_writable_dirs
from .cgroups import CgroupSupport, detect

log = logging.getLogger("cortex_backend.runs")

PROBE_TIMEOUT_S = 20.0
# What `isolation: required` insists on besides the sandbox: limits that hold for the whole run.
REQUIRED_LIMITS = ("memory", "processes")


@dataclass
class SandboxSupport:
    bwrap: str | None = None
    problem: str | None = None
    disable_userns: bool = True


def _drop_to(uid: int | None):
    if uid is None:
        return None

    def drop() -> None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    return drop


def probe_bubblewrap(as_uid: int | None) -> SandboxSupport:
    """Whether bubblewrap can build a sandbox here, run as the uid runs will have."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return SandboxSupport(problem="bubblewrap (bwrap) is not installed; install the 'bubblewrap' package")
    base = [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        *system_layout(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--remount-ro",
        "/",
    ]
    problem = "unknown"
    for disable_userns in (True, False):
        args = [bwrap, *base, *(["--disable-userns"] if disable_userns else []), "--", "/bin/true"]
        try:
            result = subprocess.run(
                args,
                capture_output=True,
                timeout=PROBE_TIMEOUT_S,
                preexec_fn=_drop_to(as_uid),
                stdin=subprocess.DEVNULL,
                cwd="/",
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return SandboxSupport(problem=f"bubblewrap could not run: {exc}")
        if result.returncode == 0:
            return SandboxSupport(bwrap=bwrap, disable_userns=disable_userns)
        problem = result.stderr.decode(errors="replace").strip() or f"exit code {result.returncode}"
    return SandboxSupport(problem=f"bubblewrap cannot create namespaces here: {problem}")


@dataclass
class HostIsolation:
    """Found once when the run manager starts."""

    sandbox: SandboxSupport
    cgroups: CgroupSupport
    world_writable: list[str] = field(default_factory=list)
    namespaces_off: bool = False

    @property
    def sandboxed(self) -> bool:
        return self.sandbox.bwrap is not None and not self.namespaces_off

    def describe(self) -> str:
        if self.namespaces_off:
            sandbox = "off (--run-namespaces off)"
        else:
            sandbox = "bubblewrap" if self.sandbox.bwrap else f"unavailable: {self.sandbox.problem}"
        return f"sandbox {sandbox}; cgroups: {self.cgroups.describe()}"

    def sandbox_view(self, allow_unsandboxed: bool) -> dict[str, object]:
        """What users are told about source runs here (GET /v1/capacity, `%cortex capacity`)."""
        if self.sandboxed:
            return {
                "sandbox": "bubblewrap",
                "runs_accepted": True,
                "note": "each run in a bubblewrap sandbox",
            }
        why = "turned off (--run-namespaces off)" if self.namespaces_off else self.sandbox.problem
        if allow_unsandboxed:
            note = (
                f"UNSANDBOXED: source runs run without a sandbox ({why}), as the backend's user, able to read"
                " its files and reach its port; the operator allowed this"
            )
            return {"sandbox": "none", "runs_accepted": True, "note": note}
        return {"sandbox": "none", "runs_accepted": False, "note": unavailable_message(why)}

    def missing_for_required(self, limits: dict[str, str]) -> str | None:
        """Why `isolation: required` cannot be met (None when it can)."""
        if self.namespaces_off:
            return "the run sandbox is turned off on this backend (--run-namespaces off)"
        if self.sandbox.bwrap is None:
            return f"this host cannot give the run sandbox: {self.sandbox.problem}"
        missing = [name for name in REQUIRED_LIMITS if not limits.get(name, "").startswith("cgroup")]
        if missing:
            return (
                f"this backend cannot enforce a per-run {' or '.join(missing)} limit (no writable cgroup for it:"
                f" {self.cgroups.describe()})"
            )
        return None


def unavailable_message(problem: str | None) -> str:
    """Why source runs are refused on a backend without a sandbox, and what to do about it."""
    return (
        f"this backend has no run sandbox ({problem}), so it runs no source code. Install bubblewrap on the"
        " backend host (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap) and restart"
        " the backend; `cortex-nb doctor` shows what the host gives. Only for trusted code: start it with"
        " --allow-unsandboxed-runs"
    )


def backend_id(data_dir: str) -> str:
    """A stable short name for this backend's cgroups (the same after a restart on the same data dir)."""
    return hashlib.sha256(os.path.realpath(data_dir).encode()).hexdigest()[:12]


def probe_host(data_dir: str, namespaces_off: bool, probe_uid: int | None) -> HostIsolation:
    sandbox = SandboxSupport(problem="turned off") if namespaces_off else probe_bubblewrap(probe_uid)
    cgroups = detect(backend_id(data_dir))
    return HostIsolation(
        sandbox=sandbox, cgroups=cgroups, world_writable=world_writable_dirs(), namespaces_off=namespaces_off
    )
