"""The devices sub-jobs run on: the GPUs NVML sees (or those named), else CPU slots."""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import nvml


@dataclass(frozen=True)
class Device:
    id: str  # "cuda:0" or "cpu"
    kind: str  # "cuda" | "cpu"
    index: int | None  # NVML index for GPUs
    name: str
    memory_bytes: int | None
    slots: int

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "kind": self.kind,
            "index": self.index,
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "slots": self.slots,
        }

    def worker_env(self) -> dict[str, str]:
        """Environment that pins a worker process to this device."""
        if self.kind == "cuda":
            return {"CUDA_VISIBLE_DEVICES": str(self.index)}
        return {"CUDA_VISIBLE_DEVICES": ""}


def _visible_gpu_indices(total: int) -> list[int]:
    """NVML indices this process may use, honouring CUDA_VISIBLE_DEVICES when it lists indices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(total))
    indices = []
    for part in visible.split(","):
        part = part.strip()
        if part.isdigit() and int(part) < total:
            indices.append(int(part))
    return indices


def _gpus(indices: list[int] | None, slots: int) -> list[Device]:
    lib = nvml.nvml()
    if lib is None:
        return []
    total = lib.nvmlDeviceGetCount()
    chosen = indices if indices is not None else _visible_gpu_indices(total)
    devices = []
    for index in chosen:
        if index >= total:
            raise ValueError(f"GPU {index} does not exist; this host has {total} GPU(s)")
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        name = lib.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        memory = lib.nvmlDeviceGetMemoryInfo(handle).total
        devices.append(Device(f"cuda:{index}", "cuda", index, name, int(memory), slots))
    return devices


def _cpu(slots: int) -> Device:
    try:
        import psutil

        memory = int(psutil.virtual_memory().total)
    except ImportError:
        memory = None
    return Device("cpu", "cpu", None, f"CPU ({os.cpu_count()} cores)", memory, slots)


def detect_devices(spec: str, sub_jobs_per_device: int) -> list[Device]:
    """Parse `--devices`: "auto", "cpu", "cpu:N" (N slots), or GPU indices like "0,1"."""
    spec = spec.strip().lower()
    if spec == "auto":
        return _gpus(None, sub_jobs_per_device) or [_cpu(sub_jobs_per_device)]
    if spec == "cpu":
        return [_cpu(sub_jobs_per_device)]
    if spec.startswith("cpu:"):
        return [_cpu(int(spec[4:]))]
    indices = [int(part) for part in spec.split(",") if part.strip()]
    gpus = _gpus(indices, sub_jobs_per_device)
    if not gpus:
        raise ValueError(f"--devices {spec} names GPUs but none is usable: {nvml.unavailable_reason()}")
    return gpus
