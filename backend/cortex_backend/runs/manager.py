"""Source-run lifecycle (the service layer): submit, queue for devices, sandbox, collect, report.

pending (queued in the shared device scheduler) -> starting (work dir unpacked, sandbox starting)
-> running (the command started) -> done | failed | cancelled, with a stable failure code.
A submission id belongs to one run for good: submitting it again returns that run, never a new one.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.priority import DEFAULT_PRIORITY
from cortex_nb.protocol.schemas import run_spec
from cortex_nb.protocol.schemas.runs import CreateRun

from ..auth import Principal
from ..config import BackendSettings
from ..devices import Device
from ..logs import LogBook, run_log_key
from ..models import ModelCatalog
from ..pagination import ListingFilter, parse_cursor, split_page
from ..scheduler import Scheduler
from ..storage_faults import is_storage_error
from ..store import Store
from ..uploads import UploadStore
from ..waiters import Waiters
from .admission import RUN_KIND, RunAdmission
from .bubblewrap import private_etc_entries
from .cgroups import RunCgroup
from .isolation import HostIsolation, probe_host
from .launcher import SandboxProcess, SandboxResult
from .outcome import classify_failure, run_report, stopped_outcome
from .outputs import collect_outputs
from .retries import attempt_record, retry_reason, should_retry
from .sandbox_config import (
    SANDBOX_WORKDIR,
    make_cgroup,
    prepare_workdir,
    sandbox_config,
)
from .script_gate import gate_report, scan_workdir
from .uids import UidPool, kill_processes_of, processes_of, remove_files_of

log = logging.getLogger("cortex_backend.runs")

SUB_JOB = "main"
STDERR_TAIL = 40


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
        "priority": run["spec"].get("priority", DEFAULT_PRIORITY),
        "labels": run["spec"].get("labels") or {},
    }


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
        # Retries: each run's attempts so far, and the timers of runs waiting out their backoff.
        self._attempts: dict[str, list[dict[str, Any]]] = {}
        self._retry_timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        # Set when this backend's devices are not on its own host (a cluster executor): runs are refused.
        self.unavailable_reason: str | None = None
        self.admission = RunAdmission(settings, store, catalog, scheduler, uploads, admit, self._system_log)
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
        if not self.host.sandboxed:
            log.warning("source runs: %s", self.sandbox_view()["note"])
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
        for timer in self._retry_timers.values():
            timer.cancel()  # a run waiting to retry is failed (backend_restarted) at the next start
        for run_id in list(self._sandboxes):
            self._stop(run_id, "backend_stopping")
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.run_kill_grace_s + 10)
        if self.host is not None:
            self.host.cgroups.remove()
        if self.uids is not None:
            self.uids.close()

    @property
    def unsandboxed_allowed(self) -> bool:
        """Runs without a sandbox only where the operator said so (or turned the sandbox off outright)."""
        return self.settings.allow_unsandboxed_runs or self.settings.run_namespaces == "off"

    def sandbox_view(self) -> dict[str, Any]:
        """Source runs' sandbox as GET /v1/capacity tells it (None-safe before start())."""
        if self.host is None:
            return {"sandbox": "unknown", "runs_accepted": False, "note": "the backend is starting"}
        return self.host.sandbox_view(self.unsandboxed_allowed)

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
        filters: ListingFilter | None = None,
    ) -> dict[str, Any]:
        owner = None if principal.is_admin else principal.owner
        if submission_id:
            run = self.store.run_by_submission(principal.owner, submission_id)
            return {"runs": [public_run(run)] if run else [], "next_cursor": None}
        runs = self.store.list_runs(owner, status, limit + 1, parse_cursor(cursor), filters)
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
    async def submit(self, principal: Principal, body: CreateRun) -> tuple[dict[str, Any], bool]:
        """Create the run, or return the one this submission id already made (runs/admission.py)."""
        if self.unavailable_reason:
            raise ApiError("unsupported_operation", self.unavailable_reason)
        if self.host is not None and not self.sandbox_view()["runs_accepted"]:
            raise ApiError("sandbox_unavailable", str(self.sandbox_view()["note"]))
        return await self.admission.submit(principal, body)

    # cancel -------------------------------------------------------------------------------------
    def cancel(self, principal: Principal, run_id: str) -> dict[str, Any]:
        run = self.visible_run(principal, run_id)
        if run["status"] in states.JOB_TERMINAL:
            return run
        waiting_to_retry = self._retry_timers.pop(run_id, None)
        if waiting_to_retry is not None:
            waiting_to_retry.cancel()
        if waiting_to_retry is not None or self.scheduler.is_pending(run_id):
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
        gate: dict[str, Any] | None = None
        cgroup: RunCgroup | None = None
        try:
            await asyncio.to_thread(prepare_workdir, self.settings.runs_dir, run, workdir, uid)
            gate = await asyncio.to_thread(self._script_gate, run_id, workdir)
            cgroup, enforced = await asyncio.to_thread(make_cgroup, self.settings, self.host, run_id)
            # Read per run (a key put under /etc after the backend started is hidden too), off the IO loop.
            hidden_etc = await asyncio.to_thread(private_etc_entries, os.geteuid())
            config = sandbox_config(
                self.settings,
                self.host,
                self.catalog,
                run,
                devices,
                workdir,
                uid,
                cgroup,
                enforced,
                hidden_etc,
                attempt=len(self._attempts.get(run_id, [])) + 1,
            )
            refusal = (
                self.host.missing_for_required(enforced)
                if run["spec"]["isolation"] == run_spec.ISOLATION_REQUIRED
                else None
            )
            if gate is not None and gate["refused"]:
                first = gate["findings"][0]
                outcome = (
                    states.JOB_FAILED,
                    "script_refused",
                    f"the script gate (strict) refused the run: {len(gate['findings'])} finding(s), first"
                    f" {first['path']}:{first['line']}: {first['message']}; GET /v1/runs/{run_id}/report"
                    " lists them all",
                )
            elif refusal is not None:
                outcome = (
                    states.JOB_FAILED,
                    "isolation_unsupported",
                    (
                        f"the spec says isolation: required, but {refusal}. Use isolation: best_effort to run with what"
                        " this host gives (the run's report lists it)"
                    ),
                )
            elif run_id in self._stop_reasons:
                outcome = stopped_outcome(run, self._stop_reasons.get(run_id))
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
            (run_dir / "sandbox.json").unlink(missing_ok=True)
            self._stop_reasons.pop(run_id, None)
            self._stderr.pop(run_id, None)
            if gate is not None:
                report = {**report, "script_gate": gate}
            if not self._retry_later(run_id, outcome, report):
                (run_dir / "source.tar").unlink(missing_ok=True)
                self._finish(run_id, *outcome, report)
            self.scheduler.release(run_id)
            self.admit()

    # retries (runs/retries.py) -------------------------------------------------------------------
    def _retry_later(
        self, run_id: str, outcome: tuple[str, str | None, str | None], report: dict[str, Any]
    ) -> bool:
        """Record this attempt; when the spec's retry policy covers its failure, queue the run again after
        its backoff (keeping its place: same priority, same submission time) and return True."""
        run = self.store.get_run(run_id)
        if run is None:
            return False
        status, code, message = outcome
        attempts = self._attempts.setdefault(run_id, [])
        number = len(attempts) + 1
        reason = retry_reason(code, report) if status == states.JOB_FAILED else None
        attempts.append(
            attempt_record(number, status, code, message, reason, run["started_at"], time.time(), report)
        )
        if not should_retry(run["spec"], number, reason):
            return False
        policy = run["spec"]["retry"]
        self.store.update_run(run_id, status=states.JOB_PENDING, report={"attempts": list(attempts)})
        self.waiters.notify(run_id)
        self._system_log(
            run_id,
            f"attempt {number} failed ({reason}: {code}): {message}; retrying in {policy['backoff_s']:g} s"
            f" (attempt {number + 1} of at most {policy['max'] + 1})",
        )
        loop = asyncio.get_running_loop()
        self._retry_timers[run_id] = loop.call_later(policy["backoff_s"], self._requeue, run_id)
        return True

    def _requeue(self, run_id: str) -> None:
        self._retry_timers.pop(run_id, None)
        run = self.store.get_run(run_id)
        if run is None or run["status"] in states.JOB_TERMINAL:
            return
        self.admission.enqueue(run)
        self._system_log(run_id, f"attempt {len(self._attempts.get(run_id, [])) + 1}: queued for a device")
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

    def _script_gate(self, run_id: str, workdir: Path) -> dict[str, Any] | None:
        """Scan the run's Python files (runs/script_gate.py); its findings go to the run's log. None: off."""
        mode = self.settings.run_script_gate
        if mode == "off":
            return None
        findings, scanned = scan_workdir(workdir, (SANDBOX_WORKDIR,), self.settings.run_script_gate_allow)
        refused = mode == "strict" and bool(findings)
        for finding in findings:
            self._system_log(
                run_id, f"script gate ({mode}): {finding.path}:{finding.line}: {finding.message}"
            )
        if not findings:
            self._system_log(run_id, f"script gate ({mode}): {scanned} Python file(s), nothing found")
        return gate_report(mode, findings, scanned, refused)

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
        try:
            self.logs.append(run_log_key(run_id), SUB_JOB, stream, lines)
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            # The run goes on, and its output keeps being read; only these lines are lost.
            log.warning("%d %s line(s) of run %s not recorded: %s", len(lines), stream, run_id, exc)
        if stream == "stderr":
            self._stderr.setdefault(run_id, collections.deque(maxlen=STDERR_TAIL)).extend(
                line for _, line in lines
            )

    # ending -------------------------------------------------------------------------------------
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
        report = run_report(self.store.get_run(run_id), result, devices, config, cgroup)
        if run_id in self._stop_reasons:
            return stopped_outcome(run, self._stop_reasons[run_id]), report
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
        tail = list(self._stderr.get(run_id, ()))
        return classify_failure(result, config, cgroup, tail), report

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
        attempts = self._attempts.pop(run_id, None)
        if attempts and run["spec"].get("retry"):
            report = {**report, "attempts": attempts}
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
