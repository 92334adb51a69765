"""A source run's sandbox, described before it starts: its work dir, cgroup, environment, limits and isolation
(the launcher, runs/sandbox.py, applies what this says)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from cortex_nb.protocol.schemas import run_spec

from ..config import BackendSettings
from ..devices import Device
from ..executors.environment import SCRUBBED_ENV_PREFIXES
from ..models import ModelCatalog
from .archive import extract_archive
from .bubblewrap import sandbox_arguments
from .cgroups import RunCgroup, RunLimits
from .isolation import HostIsolation
from .uids import task_count

log = logging.getLogger("cortex_backend.runs")

# Where the run sees its work dir when it has a mount namespace (a private /tmp holds it).
SANDBOX_WORKDIR = "/tmp/cortex-run"
# Variables a run may inherit from the backend's environment (everything else is dropped).
PASSTHROUGH_ENV = ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "TZ")
# A run's memory limit (all its processes) when --run-memory-mib is not given: this share of the host's RAM.
DEFAULT_RUN_MEMORY_SHARE = 0.75


def make_cgroup(
    settings: BackendSettings, host: HostIsolation, run_id: str
) -> tuple[RunCgroup | None, dict[str, str]]:
    """The run's cgroups with its limits set; (None, {}) where the host gives none."""
    support = host.cgroups
    if not support.usable:
        return None, {}
    cgroup = RunCgroup(support, run_id)
    try:
        enforced = cgroup.create(
            RunLimits(
                memory_bytes=run_memory_bytes(settings),
                processes=settings.run_max_processes,
                cpu_weight=settings.run_cpu_weight,
            )
        )
    except OSError as exc:
        log.warning("run %s: could not set up its cgroups (%s); its limits are per process only", run_id, exc)
        cgroup.remove()
        return None, {}
    return cgroup, enforced


def run_memory_bytes(settings: BackendSettings) -> int | None:
    """The memory all of a run's processes may take together."""
    if settings.run_memory_mib:
        return settings.run_memory_mib * 2**20
    total = host_memory_bytes()
    return int(total * DEFAULT_RUN_MEMORY_SHARE) if total else None


def prepare_workdir(runs_dir: Path, run: dict[str, Any], workdir: Path, uid: int | None) -> None:
    """The run's work dir: its verified archive unpacked, a folder per declared model, owned by its uid."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(mode=0o700)
    extract_archive(runs_dir / run["id"] / "source.tar", run["manifest"], workdir)
    for name in run["spec"]["models"]:
        (workdir / run_spec.MODELS_DIR / name).mkdir(parents=True)
    if uid is not None:
        for root, dirs, files in os.walk(workdir):
            for name in (*dirs, *files):
                os.lchown(os.path.join(root, name), uid, uid)
        os.chown(workdir, uid, uid)


def sandbox_config(
    settings: BackendSettings,
    host: HostIsolation,
    catalog: ModelCatalog,
    run: dict[str, Any],
    devices: list[Device],
    workdir: Path,
    uid: int | None,
    cgroup: RunCgroup | None,
    enforced: dict[str, str],
    hidden_etc: list[str] | None = None,
    attempt: int = 1,
) -> dict[str, Any]:
    """What the sandbox launcher (runs/sandbox.py) is told: argv, environment, limits, isolation, binds."""
    spec = run["spec"]
    gpus = [device for device in devices if device.kind == "cuda"]
    mib = 2**20
    if settings.run_address_space_mib:
        address_space = settings.run_address_space_mib * mib
    else:
        address_space = None if gpus else host_memory_bytes()
    memory_bytes = run_memory_bytes(settings)
    if memory_bytes and not gpus and "memory" not in enforced:
        # Without a cgroup the run's memory is only watched: no one process may take more than all of it.
        address_space = min(address_space or memory_bytes, memory_bytes)
    processes = settings.run_max_processes
    if os.geteuid() != 0:
        processes += task_count(os.getuid())  # RLIMIT_NPROC counts every process of the backend's uid
    command = spec["command"]
    runtime = runtime_paths()
    models = {name: str(catalog.get(name).path) for name in spec["models"]}
    disk_bytes = settings.run_disk_mib * mib if settings.run_disk_mib else None
    isolation = isolation_of(settings, host, uid, enforced)
    env = run_environment(gpus)
    # Which attempt this is (1, then 2, ... under a retry policy), for a script that resumes its own work.
    env["CORTEX_RUN_ATTEMPT"] = str(attempt)
    config: dict[str, Any] = {
        "run_id": run["id"],
        "backend_pid": os.getpid(),
        "workdir": str(workdir),
        "argv": list(command) if isinstance(command, list) else ["/bin/sh", "-c", command],
        "env": env,
        "models": models,
        "limits": {
            "address_space_bytes": address_space,
            # A file never outgrows the work-dir quota either.
            "file_size_bytes": min(settings.run_max_file_mib * mib, disk_bytes or 1 << 62),
            "processes": processes,
            "cpu_seconds": int(spec["timeout_seconds"] * max(1, os.cpu_count() or 1)) + 60,
        },
        "run_limits": {
            "memory_bytes": memory_bytes,
            "processes": settings.run_max_processes,
            "cpu_weight": settings.run_cpu_weight,
            "disk_bytes": disk_bytes,
        },
        "uid": uid,
        "gid": uid,
        "cgroup_procs": cgroup.procs_files() if cgroup is not None else [],
        "isolation": isolation,
        "watch": {},
        "kill_grace_s": settings.run_kill_grace_s,
    }
    if host.sandboxed:
        hide = [
            settings.data_dir,
            settings.workspace_dir,
            Path(os.path.expanduser("~/.config/cortex-nb")),
        ]
        config["bwrap"] = host.sandbox.bwrap
        config["bwrap_args"] = sandbox_arguments(
            workdir=str(workdir),
            sandbox_workdir=SANDBOX_WORKDIR,
            runtime_paths=runtime,
            hide_paths=[str(path) for path in hide],
            world_writable=host.world_writable,
            models=models,
            tmp_bytes=settings.run_tmp_mib * mib,
            gpu_indices=[device.index for device in gpus],
            disable_userns=host.sandbox.disable_userns,
            hidden_etc=hidden_etc,
        )
        env.update(HOME=SANDBOX_WORKDIR, PWD=SANDBOX_WORKDIR)
        config["watch"] = {
            "disk_bytes": disk_bytes,
            "memory_bytes": memory_bytes if isolation["memory"] == "watched" else None,
        }
        if uid is not None:
            # The run's uid must reach these even under a directory only root may enter.
            config["expose_paths"] = [
                *[(path, False) for path in runtime],
                (str(workdir), True),
                *[(path, False) for path in models.values()],
            ]
    return config


def isolation_of(
    settings: BackendSettings, host: HostIsolation, uid: int | None, enforced: dict[str, str]
) -> dict[str, str]:
    """How each part of the run's isolation is provided (the run report shows this)."""
    sandboxed = host.sandboxed
    if uid is not None:
        user = "dedicated_uid"
    else:
        user = "userns" if sandboxed else "same_uid"
    return {
        # Said in every run's report: a run without the sandbox ran only because the operator allowed it.
        "sandbox": "bubblewrap" if sandboxed else "none (unsandboxed runs allowed by the operator)",
        "network": "netns" if sandboxed else "none",
        "filesystem": "bwrap" if sandboxed else "none",
        "proc": "private" if sandboxed else "host",
        "processes": "pidns" if sandboxed else "subreaper",
        "tmp": "private" if sandboxed else "host",
        "keyring": "private",
        "user": user,
        "memory": enforced.get("memory") or ("watched" if sandboxed else "per_process_rlimit"),
        "process_limit": enforced.get("processes") or "per_uid_rlimit",
        "cpu": enforced.get("cpu") or "unenforced",
        "disk": "watched" if sandboxed and settings.run_disk_mib else "unenforced",
    }


def run_environment(gpus: list[Device]) -> dict[str, str]:
    """A run's whole environment: built from nothing, so no token or backend setting can leak into it."""
    env = {
        "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": "/tmp",
        "MPLBACKEND": "Agg",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "CUDA_VISIBLE_DEVICES": ",".join(str(device.index) for device in gpus),
    }
    for key in PASSTHROUGH_ENV:
        if key in os.environ and not key.startswith(SCRUBBED_ENV_PREFIXES):
            env[key] = os.environ[key]
    return env


def runtime_paths() -> list[str]:
    """The Python installation that runs a run's `python` (the backend's own), bound read-only."""
    return sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)})


def host_memory_bytes() -> int | None:
    with contextlib.suppress(ImportError):
        import psutil

        return int(psutil.virtual_memory().total)
    return None
