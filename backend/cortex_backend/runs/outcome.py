"""How a source run ended, told from what its sandbox reported: the failure code and message a user reads,
and the run report (runs/manager.py records both)."""

from __future__ import annotations

import re
import signal
import time
from typing import Any

from cortex_nb.protocol import states

from ..devices import Device
from .cgroups import RunCgroup
from .launcher import SandboxResult

# $0 of the shell that execs the command inside the sandbox (runs/sandbox.py): how its errors are told apart.
SANDBOX_SHELL_NAME = "cortex-run"
OUT_OF_MEMORY = re.compile(
    r"MemoryError|std::bad_alloc|Cannot allocate memory|out of memory|OutOfMemoryError", re.IGNORECASE
)


def stopped_outcome(run: dict[str, Any], reason: str | None) -> tuple[str, str | None, str | None]:
    """The outcome of a run stopped from outside (`reason`: cancelled, timed_out, or the backend stopping)."""
    if reason == "cancelled":
        return states.JOB_CANCELLED, "cancelled", "cancelled by the user"
    if reason == "timed_out":
        return (
            states.JOB_FAILED,
            "timed_out",
            (f"the run passed its timeout_seconds ({run['spec']['timeout_seconds']:g} s) and was stopped"),
        )
    return states.JOB_FAILED, "backend_restarted", "the backend stopped while the run was in flight"


def classify_failure(
    result: SandboxResult, config: dict[str, Any], cgroup: RunCgroup | None, stderr_tail: list[str]
) -> tuple[str, str, str]:
    """(status, failure code, message) of a run whose command did not exit 0: the limit it reached, the
    signal that ended it, or its last error line, in words a user acts on."""
    limits = config["limits"]
    run_limits = config["run_limits"]
    tail = stderr_tail
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
                f"the run's files passed its work-dir quota of {size_text(run_limits['disk_bytes'])} and the run was stopped;"
                " write less, or ask for a larger --run-disk-mib"
            ),
        )
    run_memory = size_text(run_limits["memory_bytes"])
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
            else f"its address-space limit ({size_text(limits['address_space_bytes'])} per process)"
        )
        how = f"exit code {result.exit_code}" if result.signal is None else f"signal {result.signal}"
        return (
            failed,
            "workload_out_of_memory",
            f"the workload ran out of memory: {where} ({how}). Last error: {memory_line.strip()[:300]}",
        )
    if result.signal is not None:
        name = signal_name(result.signal)
        if result.signal == signal.SIGXCPU:
            why = f"it reached the CPU-time limit of {limits['cpu_seconds']} s per process"
        elif result.signal == signal.SIGXFSZ:
            why = f"it wrote past the file-size limit of {size_text(limits['file_size_bytes'])}"
        elif result.signal == signal.SIGKILL and config["isolation"].get("memory", "").startswith("cgroup"):
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


def run_report(
    run: dict[str, Any],
    result: SandboxResult,
    devices: list[Device],
    config: dict[str, Any],
    cgroup: RunCgroup | None,
) -> dict[str, Any]:
    """What the run report says of an attempt: exit, time, device-seconds, peak memory, isolation, limits."""
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


def size_text(value: int | None) -> str:
    if value is None:
        return "unlimited"
    return f"{value / 2**30:.1f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
