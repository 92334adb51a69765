"""The devices sub-jobs run on: the GPUs NVML sees (or those named), else CPU slots."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
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
    # The machine the device is on (a cluster's devices span several).
    host: str = ""
    # The models a sub-job on this device may use; None: every model the backend has registered.
    models: frozenset[str] | None = None
    # The engine sampling sub-jobs on this device run ("transformers" | "vllm"; see sampler_choice.py).
    sampler: str = "transformers"
    # Sub-jobs it serves as slots of its adapter host, beside `slots` processes (0: it hosts none;
    # executors/base.py `Hosting.with_adapter_slots`).
    adapter_slots: int = 0

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "kind": self.kind,
            "index": self.index,
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "slots": self.slots,
            "host": self.host,
            "sampler": self.sampler,
            "adapter_slots": self.adapter_slots,
        }

    def serves(self, models: frozenset[str]) -> bool:
        return self.models is None or models <= self.models

    def worker_env(self) -> dict[str, str]:
        """Environment that pins a worker process to this device. PCI bus order makes CUDA number
        GPUs as NVML does, so the worker's GPU is the one the monitor reads."""
        if self.kind == "cuda":
            return {"CUDA_VISIBLE_DEVICES": str(self.index), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        return {"CUDA_VISIBLE_DEVICES": ""}


def devices_env(devices: tuple[Device, ...] | list[Device]) -> dict[str, str]:
    """Environment that gives one worker process several devices (a tensor-parallel engine's), in order."""
    gpus = [str(device.index) for device in devices if device.kind == "cuda"]
    if not gpus:
        return {"CUDA_VISIBLE_DEVICES": ""}
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def visible_nvml_indices(
    visible: str | None, total: int, index_of_uuid: Callable[[str], int | None]
) -> list[int]:
    """NVML indices named by a CUDA_VISIBLE_DEVICES value: indices (in PCI bus order) or GPU/MIG UUIDs.

    As CUDA does, the list ends at the first entry that names no device; None means every GPU.
    """
    if visible is None:
        return list(range(total))
    indices: list[int] = []
    for part in visible.split(","):
        part = part.strip()
        index = int(part) if part.isdigit() else (index_of_uuid(part) if part else None)
        if index is None or not 0 <= index < total:
            break
        if index not in indices:
            indices.append(index)
    return indices


def _visible_gpu_indices(total: int) -> list[int]:
    """NVML indices this process may use, honouring CUDA_VISIBLE_DEVICES."""
    lib = nvml.nvml()

    def index_of_uuid(uuid: str) -> int | None:
        try:
            return int(lib.nvmlDeviceGetIndex(lib.nvmlDeviceGetHandleByUUID(uuid)))
        except Exception:  # NVMLError: no such GPU (or a MIG instance NVML will not resolve)
            return None

    return visible_nvml_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), total, index_of_uuid)


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
        devices.append(Device(f"cuda:{index}", "cuda", index, name, int(memory), slots, socket.gethostname()))
    return devices


def _cpu(slots: int) -> Device:
    try:
        import psutil

        memory = int(psutil.virtual_memory().total)
    except ImportError:
        memory = None
    return Device("cpu", "cpu", None, f"CPU ({os.cpu_count()} cores)", memory, slots, socket.gethostname())


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
