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
