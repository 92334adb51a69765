"""The one place that talks to NVML. Initialised once per process; absence is reported, not hidden."""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_state: dict[str, Any] = {"initialised": False, "module": None, "reason": None}


def nvml() -> Any | None:
    """The initialised `pynvml` module, or None when this host has no usable NVIDIA driver."""
    with _lock:
        if not _state["initialised"]:
            _state["initialised"] = True
            try:
                import pynvml  # provided by nvidia-ml-py
            except ImportError as exc:
                _state["reason"] = f"pynvml is not installed ({exc}); install nvidia-ml-py for GPU metrics"
                return None
            try:
                pynvml.nvmlInit()
            except Exception as exc:  # NVMLError subclasses: no driver, no library, no devices
                _state["reason"] = f"NVML could not start: {exc}"
                return None
            _state["module"] = pynvml
        return _state["module"]


def unavailable_reason() -> str | None:
    """Why NVML is not available (None when it is)."""
    nvml()
    return _state["reason"]


def reset_for_tests() -> None:
    """Forget the cached state so a test can exercise another failure mode."""
    with _lock:
        _state.update(initialised=False, module=None, reason=None)
