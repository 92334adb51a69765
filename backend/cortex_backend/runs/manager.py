"""Source-run lifecycle (the service layer): submit, queue for devices, sandbox, collect, report.

pending (queued in the shared device scheduler) -> starting (work dir unpacked, sandbox starting)
-> running (the command started) -> done | failed | cancelled, with a stable failure code.
A submission id belongs to one run for good: submitting it again returns that run, never a new one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cortex_nb import run_spec
from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError

from ..auth import Principal
from ..config import BackendSettings
from ..devices import Device
from ..executor import SCRUBBED_ENV_PREFIXES
from ..logs import LogBook, run_log_key
from ..models import ModelCatalog
from ..pagination import parse_cursor, split_page
from ..scheduler import Scheduler
from ..store import Store
from ..uploads import UploadStore
from ..validation import ID_PATTERN
from ..waiters import Waiters
from .archive import extract_archive, validate_manifest, verify_archive
from .bubblewrap import sandbox_arguments
from .cgroups import RunCgroup, RunLimits
from .isolation import HostIsolation, probe_host
from .launcher import SandboxProcess, SandboxResult
from .outputs import collect_outputs
from .spec import validate_run_spec
from .uids import UidPool, kill_processes_of, processes_of, remove_files_of, task_count

log = logging.getLogger("cortex_backend.runs")

RUN_KIND = "run"
SUB_JOB = "main"
# Where the run sees its work dir when it has a mount namespace (a private /tmp holds it).
SANDBOX_WORKDIR = "/tmp/cortex-run"
# $0 of the shell that execs the command inside the sandbox (runs/sandbox.py): how its errors are told apart.
SANDBOX_SHELL_NAME = "cortex-run"
BODY_KEYS = {"submission_id", "spec", "manifest", "archive"}
OUT_OF_MEMORY = re.compile(
    r"MemoryError|std::bad_alloc|Cannot allocate memory|out of memory|OutOfMemoryError", re.IGNORECASE
)
# Variables a run may inherit from the backend's environment (everything else is dropped).
PASSTHROUGH_ENV = ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "TZ")
STDERR_TAIL = 40
# A run's memory limit (all its processes) when --run-memory-mib is not given: this share of the host's RAM.
DEFAULT_RUN_MEMORY_SHARE = 0.75


def new_run_id() -> str:
    return "run-" + secrets.token_hex(6)


def public_run(run: dict[str, Any]) -> dict[str, Any]:
    """The JSON a client sees for a run."""
    report = run.get("report") or {}
    return {
        "run_id": run["id"],
        "submission_id": run["submission_id"],
        "owner": run["owner"],
        "name": run["name"],
        "status": run["status"],
        "failure_code": run["failure_code"],
        "failure_message": run["failure_message"],
        "created_at": run["created_at"],
        "started_at": run["started_at"],
        "finished_at": run["finished_at"],
        "devices": run["devices"],
        "isolation_tier": (run["isolation"] or {}).get("network"),
        "exit_code": report.get("exit_code"),
        "spec": run["spec"],
        "outputs": run["outputs"],
    }


def _size(value: int | None) -> str:
    if value is None:
        return "unlimited"
    return f"{value / 2**30:.1f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"


class RunManager:
    def __init__(
        self,
        settings: BackendSettings,
        store: Store,
        catalog: ModelCatalog,
        scheduler: Scheduler,
        logs: LogBook,
        uploads: UploadStore,
        admit: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.catalog = catalog
        self.scheduler = scheduler
        self.logs = logs
        self.uploads = uploads
        self.admit = admit
        self.waiters = Waiters()
        # Found at start(): the run uids this backend holds (root only) and what isolation the host gives.
        self.uids: UidPool | None = None
        self.host: HostIsolation | None = None
        self._sandboxes: dict[str, SandboxProcess] = {}
        self._stop_reasons: dict[str, str] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._stderr: dict[str, collections.deque[str]] = {}
        self._submitting: dict[tuple[str, str], asyncio.Future] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        # Set when this backend's devices are not on its own host (a cluster executor): runs are refused.
        self.unavailable_reason: str | None = None
        scheduler.admission_listeners[RUN_KIND] = self.admitted

    # start-up and shutdown ----------------------------------------------------------------------
    async def start(self) -> None:
        """Find what isolation the host gives, claim run uids, kill leftovers of runs from a previous life
        (only what is in this backend's own run cgroups), empty the workspace, fail stale runs."""
        await asyncio.to_thread(self._prepare_host)
        await asyncio.to_thread(self._clean_workspace)
        for run in self.store.runs_with_status([states.JOB_PENDING, states.JOB_STARTING, states.JOB_RUNNING]):
            self.store.update_run(
                run["id"],
                status=states.JOB_FAILED,
                failure_code="backend_restarted",
                finished_at=time.time(),
                failure_message="the backend restarted while this run was in flight; submit it again with a new submission id",
            )
            (self.settings.runs_dir / run["id"] / "source.tar").unlink(missing_ok=True)

    def _prepare_host(self) -> None:
        settings = self.settings
        if os.geteuid() == 0:
            self.uids = UidPool(settings.run_uid_base, max(1, self.scheduler.total_slots))
            self.uids.claim()
        probe_uid = self.uids.uids[0] if self.uids is not None else None
        self.host = probe_host(str(settings.data_dir), settings.run_namespaces == "off", probe_uid)
        killed = self.host.cgroups.cleanup_stale()
        if killed:
            log.warning("killed %d process(es) left in this backend's run cgroups by a previous life", killed)
        log.info(
            "source runs: %s%s",
            self.host.describe(),
            f"; run uids {self.uids.uids[0]}..{self.uids.uids[-1]}" if self.uids is not None else "",
        )

    def _clean_workspace(self) -> None:
        workspace = self.settings.workspace_dir
        shutil.rmtree(workspace, ignore_errors=True)
        workspace.mkdir(parents=True, exist_ok=True)
        workspace.chmod(0o711)
        self.settings.runs_dir.mkdir(parents=True, exist_ok=True)
        self.settings.runs_dir.chmod(0o700)

    async def stop(self) -> None:
        for run_id in list(self._sandboxes):
            self._stop(run_id, "backend_stopping")
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.run_kill_grace_s + 10)
        if self.host is not None:
            self.host.cgroups.remove()
        if self.uids is not None:
            self.uids.close()

    # queries ------------------------------------------------------------------------------------
    def visible_run(self, principal: Principal, run_id: str) -> dict[str, Any]:
        run = self.store.get_run(run_id)
        if run is None or not principal.can_see(run["owner"]):
            raise ApiError(
                "run_not_found", f"no run {run_id!r} is visible to this token; list yours with GET /v1/runs"
            )
        return run

    def list(
        self,
        principal: Principal,
        status: str | None,
        limit: int,
        cursor: str | None,
        submission_id: str | None,
    ) -> dict[str, Any]:
        owner = None if principal.is_admin else principal.owner
        if submission_id:
            run = self.store.run_by_submission(principal.owner, submission_id)
            return {"runs": [public_run(run)] if run else [], "next_cursor": None}
        runs = self.store.list_runs(owner, status, limit + 1, parse_cursor(cursor))
        page, next_cursor = split_page(runs, limit)
        return {"runs": [public_run(run) for run in page], "next_cursor": next_cursor}

    async def wait_for_change(
        self, principal: Principal, run_id: str, from_status: str | None, wait_s: float
    ) -> dict[str, Any]:
        run = self.visible_run(principal, run_id)
        if from_status is not None and run["status"] == from_status and wait_s > 0:
            await self.waiters.wait(run_id, wait_s)
            run = self.visible_run(principal, run_id)
        return run

    def report(self, principal: Principal, run_id: str) -> dict[str, Any]:
        run = self.visible_run(principal, run_id)
        report = dict(run["report"] or {})
        if run["status"] == states.JOB_RUNNING and run["started_at"]:
            wall = time.time() - run["started_at"]
            report.update(
                wall_seconds=round(wall, 3), device_seconds=round(wall * max(1, len(run["devices"])), 3)
            )
        report.setdefault("isolation", run["isolation"])
        report.setdefault("isolation_tier", (run["isolation"] or {}).get("network"))
        return {
            "run_id": run["id"],
            "status": run["status"],
            "failure_code": run["failure_code"],
            "failure_message": run["failure_message"],
            "started_at": run["started_at"],
            "finished_at": run["finished_at"],
            **report,
        }

    def output_file(self, principal: Principal, run_id: str, name: str) -> tuple[Path, dict[str, Any]]:
        """The stored file of a collected output, with its recorded length and SHA-256."""
        run = self.visible_run(principal, run_id)
        if name not in run["spec"]["outputs"]:
            raise ApiError(
                "output_not_declared",
                f"run {run_id} declares no output {name!r}; its outputs are {sorted(run['spec']['outputs'])}",
                {"declared": sorted(run["spec"]["outputs"])},
            )
        record = run["outputs"].get(name)
        if record is None:
            why = (
                "it was not written"
                if run["status"] in states.JOB_TERMINAL
                else f"the run is still {run['status']}"
            )
            raise ApiError("output_not_available", f"output {name!r} of run {run_id} is not available: {why}")
        return self.settings.runs_dir / run_id / "outputs" / name, record

    def outputs(self, principal: Principal, run_id: str) -> dict[str, Any]:
        run = self.visible_run(principal, run_id)
        rows = []
        for name, entry in run["spec"]["outputs"].items():
            record = run["outputs"].get(name)
            rows.append(
                {
                    "name": name,
                    "path": entry["path"],
                    "max_bytes": entry["max_bytes"],
                    "required": entry["required"],
                    "collected": record is not None,
                    "bytes": record and record["bytes"],
                    "sha256": record and record["sha256"],
                }
            )
        return {"run_id": run_id, "status": run["status"], "outputs": rows}

    # submit -------------------------------------------------------------------------------------
    async def submit(self, principal: Principal, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create the run, or return the one this submission id already made; (run, created)."""
        if self.unavailable_reason:
            raise ApiError("unsupported_operation", self.unavailable_reason)
        unknown = sorted(set(body) - BODY_KEYS)
        if unknown:
            raise ApiError(
                "invalid_field",
                f"{unknown[0]}: unknown field; allowed: {sorted(BODY_KEYS)}",
                {"field": unknown[0]},
            )
        submission_id = body.get("submission_id") or "sub-" + secrets.token_hex(8)
        if not isinstance(submission_id, str) or not ID_PATTERN.match(submission_id):
            raise ApiError(
                "invalid_field",
                "submission_id: 1-64 letters, digits, '_', '.', '-'",
                {"field": "submission_id"},
            )
        existing = self.store.run_by_submission(principal.owner, submission_id)
        if existing is not None:
            return self._same_submission(existing, body), False
        key = (principal.owner, submission_id)
        in_flight = self._submitting.get(key)
        if in_flight is not None:
            return self._same_submission(await asyncio.shield(in_flight), body), False
        future = asyncio.get_running_loop().create_future()
        self._submitting[key] = future
        try:
            run = await self._create(principal, submission_id, body)
            future.set_result(run)
            return run, True
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here, so an unawaited copy never warns
            raise
        finally:
            del self._submitting[key]

    def _same_submission(self, run: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """A repeated submission id must carry the same spec and files: it is a retry, never a new run."""
        spec = validate_run_spec(body.get("spec"), self.catalog, self.scheduler)
        manifest = validate_manifest(body.get("manifest", []), spec)
        if spec != run["spec"] or manifest != run["manifest"]:
            raise ApiError(
                "conflict",
                f"submission id {run['submission_id']!r} already made run {run['id']} with another"
                " spec or other files; use a new submission id for a new run",
                {"run_id": run["id"]},
            )
        return run

    async def _create(self, principal: Principal, submission_id: str, body: dict[str, Any]) -> dict[str, Any]:
        spec = validate_run_spec(body.get("spec"), self.catalog, self.scheduler)
        manifest = validate_manifest(body.get("manifest", []), spec)
        run_id = new_run_id()
        run_dir = self.settings.runs_dir / run_id
        run_dir.mkdir(parents=True)
        archive_path = run_dir / "source.tar"
        try:
            archive = body.get("archive")
            if archive is None:
                if manifest:
                    raise ApiError(
                        "invalid_field",
                        "archive: required when the manifest lists files",
                        {"field": "archive"},
                    )
                await asyncio.to_thread(_write_empty_tar, archive_path)
            else:
                if (
                    not isinstance(archive, dict)
                    or not isinstance(archive.get("upload_id"), str)
                    or not isinstance(archive.get("sha256"), str)
                ):
                    raise ApiError(
                        "invalid_field", "archive: must be {upload_id, sha256}", {"field": "archive"}
                    )
                await asyncio.to_thread(
                    self.uploads.take_to_file,
                    principal,
                    archive["upload_id"],
                    archive["sha256"],
                    archive_path,
                )
            await asyncio.to_thread(verify_archive, archive_path, manifest)
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        self.store.insert_run(
            {
                "id": run_id,
                "owner": principal.owner,
                "submission_id": submission_id,
                "name": spec["name"],
                "status": states.JOB_PENDING,
                "spec": spec,
                "manifest": manifest,
            }
        )
        gpu = spec["resources"]["gpu"]
        if gpu["count"]:
            self.scheduler.enqueue(
                run_id, gpu["count"], int(gpu["min_vram_gib"] * 2**30), kind=RUN_KIND, exclusive=True
            )
        else:
            self.scheduler.enqueue(run_id, 1, kind=RUN_KIND)
        self._system_log(
            run_id,
            f"run {run_id} ({spec['name']}) accepted: {len(manifest)} file(s) verified; queued for a device",
        )
        self.admit()
        return self.store.get_run(run_id)

    # cancel -------------------------------------------------------------------------------------
    def cancel(self, principal: Principal, run_id: str) -> dict[str, Any]:
        run = self.visible_run(principal, run_id)
        if run["status"] in states.JOB_TERMINAL:
            return run
        if self.scheduler.is_pending(run_id):
            self.scheduler.withdraw(run_id)
            (self.settings.runs_dir / run_id / "source.tar").unlink(missing_ok=True)
            self._finish(
                run_id, states.JOB_CANCELLED, "cancelled", "cancelled by the user before it started", {}
            )
            self.admit()
        else:
            self._stop(run_id, "cancelled")
        return self.store.get_run(run_id)

    def _stop(self, run_id: str, reason: str) -> None:
        if run_id in self._stop_reasons:
            return
        self._stop_reasons[run_id] = reason
        self._system_log(
            run_id,
            {
                "cancelled": "cancel requested: stopping the run",
                "timed_out": "timeout_seconds reached: stopping the run",
                "backend_stopping": "the backend is stopping: stopping the run",
            }[reason],
        )
        sandbox = self._sandboxes.get(run_id)
        if sandbox is not None:
            sandbox.stop()

    # running ------------------------------------------------------------------------------------
    def admitted(self, run_id: str, placement: list[Device]) -> None:
        """Scheduler callback: the run holds its device slots now."""
        devices = list(dict.fromkeys(placement))
        task = asyncio.ensure_future(self._execute(run_id, devices))
        self._tasks[run_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(run_id, None))

    async def _execute(self, run_id: str, devices: list[Device]) -> None:
        run = self.store.get_run(run_id)
        if run is None or run["status"] in states.JOB_TERMINAL:
            self.scheduler.release(run_id)
            self.admit()
            return
        self._set_status(run_id, states.JOB_STARTING, devices=[device.id for device in devices])
        uid = self.uids.acquire() if self.uids is not None else None
        workdir = self.settings.workspace_dir / run_id
        run_dir = self.settings.runs_dir / run_id
        outcome: tuple[str, str | None, str | None] = (
            states.JOB_FAILED,
            "sandbox_failed",
            "the run ended unexpectedly",
        )
        report: dict[str, Any] = {}
        cgroup: RunCgroup | None = None
        try:
            await asyncio.to_thread(self._prepare_workdir, run, workdir, uid)
            cgroup, enforced = await asyncio.to_thread(self._make_cgroup, run_id)
            config = self._sandbox_config(run, devices, workdir, uid, cgroup, enforced)
            refusal = (
                self.host.missing_for_required(enforced)
                if run["spec"]["isolation"] == run_spec.ISOLATION_REQUIRED
                else None
            )
            if refusal is not None:
                outcome = (
                    states.JOB_FAILED,
                    "isolation_unsupported",
                    (
                        f"the spec says isolation: required, but {refusal}. Use isolation: best_effort to run with what"
                        " this host gives (the run's report lists it)"
                    ),
                )
            elif run_id in self._stop_reasons:
                outcome = self._stopped_outcome(run)
            else:
                config_path = run_dir / "sandbox.json"
                fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as handle:
                    json.dump(config, handle)
                sandbox = SandboxProcess(
                    config_path,
                    on_output=lambda stream, lines: self._on_output(run_id, stream, lines),
                    on_started=lambda event: self._on_started(run_id, event),
                    kill_grace_s=self.settings.run_kill_grace_s,
                )
                self._sandboxes[run_id] = sandbox
                await sandbox.start()
                if run_id in self._stop_reasons:
                    sandbox.stop()
                result = await sandbox.wait()
                # Nothing of the run may still be changing its work dir while the outputs are read.
                await self._kill_leftovers(run_id, uid, cgroup)
                outcome, report = await self._conclude(run, result, devices, workdir, config, cgroup)
        except Exception as exc:
            log.exception("run %s failed in the backend", run_id)
            outcome = (
                states.JOB_FAILED,
                "sandbox_failed",
                f"the backend could not run it: {type(exc).__name__}: {exc}",
            )
        finally:
            timer = self._timers.pop(run_id, None)
            if timer is not None:
                timer.cancel()
            self._sandboxes.pop(run_id, None)
            await self._kill_leftovers(run_id, uid, cgroup)
            await asyncio.to_thread(shutil.rmtree, workdir, True)
            if cgroup is not None:
                await asyncio.to_thread(cgroup.remove)
            if uid is not None:
                # A uid serves the next run only once nothing of this one is left, process or file. Without the
                # sandbox a run could write to the host's shared places (/tmp, /var/tmp, ...): clear those too.
                clean = not workdir.exists() and not await asyncio.to_thread(processes_of, {uid})
                if not self.host.sandboxed:
                    clean = await asyncio.to_thread(remove_files_of, uid, self.host.world_writable) and clean
                self.uids.release(uid, clean)
            (run_dir / "source.tar").unlink(missing_ok=True)
            (run_dir / "sandbox.json").unlink(missing_ok=True)
            self._stop_reasons.pop(run_id, None)
            self._stderr.pop(run_id, None)
            self._finish(run_id, *outcome, report)
            self.scheduler.release(run_id)
            self.admit()

    async def _kill_leftovers(self, run_id: str, uid: int | None, cgroup: RunCgroup | None) -> None:
        """Kill what is left of this run, and only of it: its cgroup's processes, then any process of its uid
        (a uid this backend holds the host-wide lock of, so no other backend's run can have it)."""
        killed = 0
        if cgroup is not None:
            killed += await asyncio.to_thread(cgroup.kill)
        if uid is not None:
            killed += await asyncio.to_thread(kill_processes_of, {uid})
        if killed:
            self._system_log(run_id, f"killed {killed} process(es) the run left behind")

    def _make_cgroup(self, run_id: str) -> tuple[RunCgroup | None, dict[str, str]]:
        """The run's cgroups with its limits set; (None, {}) where the host gives none."""
        support = self.host.cgroups
        if not support.usable:
            return None, {}
        settings = self.settings
        cgroup = RunCgroup(support, run_id)
        try:
            enforced = cgroup.create(
                RunLimits(
                    memory_bytes=self._run_memory_bytes(),
                    processes=settings.run_max_processes,
                    cpu_weight=settings.run_cpu_weight,
                )
            )
        except OSError as exc:
            log.warning(
                "run %s: could not set up its cgroups (%s); its limits are per process only", run_id, exc
            )
            cgroup.remove()
            return None, {}
        return cgroup, enforced

    def _run_memory_bytes(self) -> int | None:
        if self.settings.run_memory_mib:
            return self.settings.run_memory_mib * 2**20
        total = _host_memory_bytes()
        return int(total * DEFAULT_RUN_MEMORY_SHARE) if total else None

    def _prepare_workdir(self, run: dict[str, Any], workdir: Path, uid: int | None) -> None:
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(mode=0o700)
        extract_archive(self.settings.runs_dir / run["id"] / "source.tar", run["manifest"], workdir)
        for name in run["spec"]["models"]:
            (workdir / run_spec.MODELS_DIR / name).mkdir(parents=True)
        if uid is not None:
            for root, dirs, files in os.walk(workdir):
                for name in (*dirs, *files):
                    os.lchown(os.path.join(root, name), uid, uid)
            os.chown(workdir, uid, uid)

    def _sandbox_config(
        self,
        run: dict[str, Any],
        devices: list[Device],
        workdir: Path,
        uid: int | None,
        cgroup: RunCgroup | None,
        enforced: dict[str, str],
    ) -> dict[str, Any]:
        spec = run["spec"]
        gpus = [device for device in devices if device.kind == "cuda"]
        settings = self.settings
        host = self.host
        mib = 2**20
        if settings.run_address_space_mib:
            address_space = settings.run_address_space_mib * mib
        else:
            address_space = None if gpus else _host_memory_bytes()
        memory_bytes = self._run_memory_bytes()
        if memory_bytes and not gpus and "memory" not in enforced:
            # Without a cgroup the run's memory is only watched: no one process may take more than all of it.
            address_space = min(address_space or memory_bytes, memory_bytes)
        processes = settings.run_max_processes
        if os.geteuid() != 0:
            processes += task_count(os.getuid())  # RLIMIT_NPROC counts every process of the backend's uid
        command = spec["command"]
        runtime = runtime_paths()
        models = {name: str(self.catalog.get(name).path) for name in spec["models"]}
        disk_bytes = settings.run_disk_mib * mib if settings.run_disk_mib else None
        isolation = self._isolation(uid, enforced)
        env = run_environment(gpus)
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

    def _isolation(self, uid: int | None, enforced: dict[str, str]) -> dict[str, str]:
        """How each part of the run's isolation is provided (the run report shows this)."""
        sandboxed = self.host.sandboxed
        if uid is not None:
            user = "dedicated_uid"
        else:
            user = "userns" if sandboxed else "same_uid"
        return {
            "network": "netns" if sandboxed else "none",
            "filesystem": "bwrap" if sandboxed else "none",
            "proc": "private" if sandboxed else "host",
            "processes": "pidns" if sandboxed else "subreaper",
            "tmp": "private" if sandboxed else "host",
            "user": user,
            "memory": enforced.get("memory") or ("watched" if sandboxed else "per_process_rlimit"),
            "process_limit": enforced.get("processes") or "per_uid_rlimit",
            "cpu": enforced.get("cpu") or "unenforced",
            "disk": "watched" if sandboxed and self.settings.run_disk_mib else "unenforced",
        }

    def _on_started(self, run_id: str, event: dict[str, Any]) -> None:
        run = self.store.get_run(run_id)
        if run is None or run["status"] in states.JOB_TERMINAL:
            return
        isolation = event.get("isolation") or {}
        self._set_status(run_id, states.JOB_RUNNING, started_at=time.time(), isolation=isolation)
        self._system_log(
            run_id, "sandbox: " + ", ".join(f"{key}={value}" for key, value in sorted(isolation.items()))
        )
        timeout = float(run["spec"]["timeout_seconds"])
        self._timers[run_id] = asyncio.get_running_loop().call_later(timeout, self._stop, run_id, "timed_out")

    def _on_output(self, run_id: str, stream: str, lines: list[tuple[float, str]]) -> None:
        self.logs.append(run_log_key(run_id), SUB_JOB, stream, lines)
        if stream == "stderr":
            self._stderr.setdefault(run_id, collections.deque(maxlen=STDERR_TAIL)).extend(
                line for _, line in lines
            )

    # ending -------------------------------------------------------------------------------------
    def _stopped_outcome(self, run: dict[str, Any]) -> tuple[str, str | None, str | None]:
        reason = self._stop_reasons.get(run["id"])
        if reason == "cancelled":
            return states.JOB_CANCELLED, "cancelled", "cancelled by the user"
        if reason == "timed_out":
            return (
                states.JOB_FAILED,
                "timed_out",
                (
                    f"the run passed its timeout_seconds ({run['spec']['timeout_seconds']:g} s) and was stopped"
                ),
            )
        return states.JOB_FAILED, "backend_restarted", "the backend stopped while the run was in flight"

    async def _conclude(
        self,
        run: dict[str, Any],
        result: SandboxResult,
        devices: list[Device],
        workdir: Path,
        config: dict[str, Any],
        cgroup: RunCgroup | None,
    ) -> tuple[tuple[str, str | None, str | None], dict[str, Any]]:
        run_id = run["id"]
        report = self._report(run_id, result, devices, config, cgroup)
        if run_id in self._stop_reasons:
            return self._stopped_outcome(run), report
        if result.setup_failure is not None:
            code, message = result.setup_failure
            return (states.JOB_FAILED, code, message), report
        if result.exit_code == 0:
            collected, failure = await asyncio.to_thread(
                collect_outputs, workdir, run["spec"]["outputs"], self.settings.runs_dir / run_id / "outputs"
            )
            self.store.update_run(run_id, outputs=collected)
            report["outputs_bytes"] = sum(entry["bytes"] for entry in collected.values())
            if failure is not None:
                return (states.JOB_FAILED, failure.code, failure.message), report
            return (states.JOB_DONE, None, None), report
        return self._classify_failure(run_id, result, config, cgroup), report

    def _classify_failure(
        self, run_id: str, result: SandboxResult, config: dict[str, Any], cgroup: RunCgroup | None
    ) -> tuple[str, str, str]:
        limits = config["limits"]
        run_limits = config["run_limits"]
        tail = list(self._stderr.get(run_id, ()))
        memory_line = next((line for line in reversed(tail) if OUT_OF_MEMORY.search(line)), None)
        last_line = next((line for line in reversed(tail) if line.strip()), "")
        failed = states.JOB_FAILED
        if result.error:
            return failed, "workload_runtime_failed", f"{result.error} (exit code {result.exit_code})"
        if result.limit_exceeded == "disk":
            return (
                failed,
                "disk_quota_exceeded",
                (
                    f"the run's files passed its work-dir quota of {_size(run_limits['disk_bytes'])} and the run was stopped;"
                    " write less, or ask for a larger --run-disk-mib"
                ),
            )
        run_memory = _size(run_limits["memory_bytes"])
        if result.limit_exceeded == "memory" or (cgroup is not None and cgroup.out_of_memory()):
            return (
                failed,
                "workload_out_of_memory",
                (
                    f"the run reached its memory limit of {run_memory} (all its processes together) and the kernel killed"
                    f" {'a process of it' if result.limit_exceeded != 'memory' else 'it'}"
                ),
            )
        if memory_line is not None:
            where = (
                "the GPU"
                if "cuda" in memory_line.lower()
                else f"its address-space limit ({_size(limits['address_space_bytes'])} per process)"
            )
            how = f"exit code {result.exit_code}" if result.signal is None else f"signal {result.signal}"
            return (
                failed,
                "workload_out_of_memory",
                f"the workload ran out of memory: {where} ({how}). Last error: {memory_line.strip()[:300]}",
            )
        if result.signal is not None:
            name = _signal_name(result.signal)
            if result.signal == signal.SIGXCPU:
                why = f"it reached the CPU-time limit of {limits['cpu_seconds']} s per process"
            elif result.signal == signal.SIGXFSZ:
                why = f"it wrote past the file-size limit of {_size(limits['file_size_bytes'])}"
            elif result.signal == signal.SIGKILL and config["isolation"].get("memory", "").startswith(
                "cgroup"
            ):
                why = f"not by its memory limit ({run_memory}, which it did not reach): from outside the run"
            elif result.signal == signal.SIGKILL:
                why = "from outside the run (the host's out-of-memory killer, or an operator)"
            else:
                why = "see the logs"
            if cgroup is not None and cgroup.process_limit_hit():
                why += f"; it also reached its limit of {run_limits['processes']} processes"
            return failed, "workload_runtime_failed", f"the command was killed by {name}: {why}"
        if result.exit_code in (126, 127) and last_line.startswith(SANDBOX_SHELL_NAME + ":"):
            # The sandbox's start-up shell could not exec the command (not found, or not executable).
            why = last_line.split("exec:", 1)[-1].strip()
            return (
                failed,
                "workload_runtime_failed",
                f"could not start the command: {why} (exit code {result.exit_code})",
            )
        message = f"the command exited with code {result.exit_code}"
        if cgroup is not None and cgroup.process_limit_hit():
            message += f" after reaching its limit of {run_limits['processes']} processes (fork failed)"
        if last_line:
            message += f"; last error line: {last_line.strip()[:300]}"
        return failed, "workload_runtime_failed", message

    def _report(
        self,
        run_id: str,
        result: SandboxResult,
        devices: list[Device],
        config: dict[str, Any],
        cgroup: RunCgroup | None,
    ) -> dict[str, Any]:
        run = self.store.get_run(run_id)
        started, now = run["started_at"], time.time()
        wall = (now - started) if started else 0.0
        gpus = [device for device in devices if device.kind == "cuda"]
        isolation = result.isolation or config["isolation"]
        peak = cgroup.peak_memory_bytes() if cgroup is not None else None
        cpu_seconds = cgroup.cpu_seconds() if cgroup is not None else None
        unenforced = [
            name
            for name in ("memory", "process_limit", "cpu", "disk")
            if isolation.get(name) in ("unenforced", "per_process_rlimit", "per_uid_rlimit")
        ]
        return {
            "exit_code": result.exit_code,
            "signal": result.signal,
            "wall_seconds": round(wall, 3),
            "device_seconds": round(wall * max(1, len(gpus)), 3),
            "device_kind": "cuda" if gpus else (devices[0].kind if devices else "cpu"),
            "devices": [device.id for device in devices],
            "gpu_count": len(gpus),
            "cpu_seconds": round(cpu_seconds, 3) if cpu_seconds is not None else result.cpu_seconds,
            # The cgroup's peak covers every process of the run together; without one, the largest process.
            "peak_memory_bytes": peak if peak is not None else result.max_rss_bytes,
            "peak_memory_source": "cgroup" if peak is not None else "largest_process",
            "isolation_tier": isolation.get("network", "none"),
            "isolation": isolation,
            "unenforced": unenforced,
            "run_uid": config["uid"],
            "limits": {
                **config["limits"],
                **config["run_limits"],
                "timeout_seconds": run["spec"]["timeout_seconds"],
            },
        }

    def _finish(
        self, run_id: str, status: str, code: str | None, message: str | None, report: dict[str, Any]
    ) -> None:
        run = self.store.get_run(run_id)
        if run is None or run["status"] in states.JOB_TERMINAL:
            return
        fields: dict[str, Any] = {
            "status": status,
            "failure_code": code,
            "failure_message": message,
            "finished_at": time.time(),
        }
        if report:
            fields["report"] = report
        self.store.update_run(run_id, **fields)
        summary = status if code is None else f"{status} ({code}): {message}"
        self._system_log(run_id, f"run ended: {summary}")
        self.waiters.notify(run_id)
        self.logs.waiters.notify(run_log_key(run_id))

    def _set_status(self, run_id: str, status: str, **fields: Any) -> None:
        self.store.update_run(run_id, status=status, **fields)
        self.waiters.notify(run_id)

    def _system_log(self, run_id: str, line: str) -> None:
        self.logs.append(run_log_key(run_id), SUB_JOB, "system", [(time.time(), line)])


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


def _host_memory_bytes() -> int | None:
    with contextlib.suppress(ImportError):
        import psutil

        return int(psutil.virtual_memory().total)
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _write_empty_tar(path: Path) -> None:
    import tarfile

    with tarfile.open(path, "w"):
        pass
