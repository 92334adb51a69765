"""Peak memory of the current operation: GPU allocator peak on CUDA, process RSS peak on CPU."""

from __future__ import annotations

import resource

import torch


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, int | str]:
    if device.type == "cuda":
        return {"peak_memory_bytes": int(torch.cuda.max_memory_allocated(device)), "peak_memory_kind": "gpu"}
    # ru_maxrss is in KiB on Linux: the process's high-water mark so far.
    return {
        "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_memory_kind": "cpu_rss",
    }
