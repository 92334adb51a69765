"""The device under test: its name, NVML readings, and the peak numbers MFU and rooflines divide by."""

from __future__ import annotations

from typing import Any

# Dense bf16 tensor-core FLOP/s and HBM bytes/s from the vendors' data sheets (SXM parts).
PEAKS: dict[str, tuple[float, float]] = {
    "H200": (989e12, 4.8e12),
    "H100": (989e12, 3.35e12),
    "A100": (312e12, 2.039e12),
    "L40S": (362e12, 0.864e12),
}


def peaks_for(name: str, tflops: float | None, hbm_tbps: float | None) -> tuple[float | None, float | None]:
    """(FLOP/s, bytes/s) for a device name, unless given; None where unknown (a CPU, an unlisted GPU)."""
    found = next((peak for key, peak in PEAKS.items() if key in name.upper()), (None, None))
    return (tflops * 1e12 if tflops else found[0]), (hbm_tbps * 1e12 if hbm_tbps else found[1])


def nvml_readings() -> dict[str, Any]:
    """Every GPU's NVML reading now (utilisation, memory, temperature, power), or why there is none."""
    from cortex_backend import nvml
    from cortex_backend.monitor import GpuReader

    lib = nvml.nvml()
    if lib is None:
        return {"available": False, "reason": nvml.unavailable_reason()}
    gpus = []
    for index in range(lib.nvmlDeviceGetCount()):
        reader = GpuReader(lib, index)
        name = lib.nvmlDeviceGetName(reader.handle)
        gpus.append(
            {"index": index, "name": name.decode() if isinstance(name, bytes) else name, **reader.read()}
        )
    return {"available": True, "driver": _text(lib.nvmlSystemGetDriverVersion()), "gpus": gpus}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def device_summary(device: str) -> dict[str, Any]:
    import torch

    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        return {
            "device": "cuda:0",
            "name": properties.name,
            "memory_bytes": int(properties.total_memory),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        }
    import os

    return {"device": "cpu", "name": f"CPU ({os.cpu_count()} cores)", "torch": torch.__version__}


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_used_bytes(device: str) -> int:
    """Device memory in use on every GPU now (NVML); 0 on a CPU."""
    from cortex_backend import nvml

    lib = nvml.nvml() if device == "cuda" else None
    if lib is None:
        return 0
    return sum(
        int(lib.nvmlDeviceGetMemoryInfo(lib.nvmlDeviceGetHandleByIndex(index)).used)
        for index in range(lib.nvmlDeviceGetCount())
    )


def free_bytes(device: str) -> int:
    """Memory free for more slots: GPU 0's free device memory (NVML, else torch), or available host RAM."""
    if device == "cuda":
        from cortex_backend import nvml

        lib = nvml.nvml()
        if lib is not None:
            return int(lib.nvmlDeviceGetMemoryInfo(lib.nvmlDeviceGetHandleByIndex(0)).free)
        import torch

        return int(torch.cuda.mem_get_info(0)[0])
    import psutil

    return int(psutil.virtual_memory().available)


def process_memory(pid: int, device: str, used_before: int = 0) -> dict[str, Any]:
    """What a process and its descendants hold, with how it was read (`kind`):
    - cpu_pss: the summed PSS of the tree (a page shared by n processes counts 1/n, so shared libraries
      and a shared base count once);
    - gpu_nvml_pid: device memory NVML attributes to the tree's pids, on every GPU;
    - gpu_used_delta: where NVML sees other pids (a container's pid namespace), every GPU's used memory
      less `used_before` (read before the process started), so only valid while it is the one newcomer."""
    import psutil

    root = psutil.Process(pid)
    tree = [root, *root.children(recursive=True)]
    if device != "cuda":
        total = 0
        for process in tree:
            try:
                total += process.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return {"bytes": int(total), "kind": "cpu_pss"}
    from cortex_backend import nvml

    lib = nvml.nvml()
    pids = {process.pid for process in tree}
    if lib is not None:
        matched = [
            int(running.usedGpuMemory)
            for index in range(lib.nvmlDeviceGetCount())
            for running in lib.nvmlDeviceGetComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(index))
            if running.pid in pids and running.usedGpuMemory is not None
        ]
        if matched:
            return {"bytes": sum(matched), "kind": "gpu_nvml_pid"}
    return {"bytes": device_used_bytes(device) - used_before, "kind": "gpu_used_delta"}


def wait_for_exit(pid: int, timeout_s: float = 60.0) -> bool:
    """Whether the process is gone within the timeout (a cancelled sub-job's worker frees its memory)."""
    import time

    import psutil

    deadline = time.monotonic() + timeout_s
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return not psutil.pid_exists(pid)
