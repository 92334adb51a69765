"""Admission by bytes on an adapter host: a new slot is refused when what it adds would not fit.

The slot is measured, not estimated: once its adapter is built (before any step), its bytes are exact,
and what it will add later (gradients and the optimizer's two moments, each the adapter's size) is known.
With `--adapter-host-memory BYTES` the host keeps its base and slots within that many bytes; without it,
on a GPU, the slot must fit in the device's free memory (which counts every process on the device) less
a reserve for activations; on a CPU without the option nothing is checked.
"""

from __future__ import annotations

from dataclasses import dataclass

# Kept free on a GPU for activations and the allocator's slack when no budget is given.
GPU_RESERVE_FRACTION = 0.05


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str


def _mib(count: int) -> str:
    return f"{count / 2**20:,.1f} MiB"


def check_slot(
    slot_bytes: int,
    allocated_bytes: int,
    base_bytes: int,
    other_slots_bytes: int,
    other_slots: int,
    budget_bytes: int | None,
    device_free: tuple[int, int] | None,
) -> Refusal | None:
    """None when the slot fits. `slot_bytes`: all it will hold; `allocated_bytes`: what of that is already
    allocated (its adapter); `device_free`: (free, total) bytes of the device, or None off a GPU."""
    if budget_bytes is not None:
        used = base_bytes + other_slots_bytes
        if used + slot_bytes <= budget_bytes:
            return None
        return Refusal(
            code="adapter_host_full",
            message=f"this slot needs {_mib(slot_bytes)} (adapter, gradients, optimizer moments); its adapter host"
            f" holds the base ({_mib(base_bytes)}) and {other_slots} other slot(s) ({_mib(other_slots_bytes)})"
            f" of its {_mib(budget_bytes)} budget (--adapter-host-memory). Wait for a slot to end, use a"
            " smaller rank or fewer target modules, or ask the operator for a larger budget",
        )
    if device_free is None:
        return None
    free, total = device_free
    still_to_allocate = max(0, slot_bytes - allocated_bytes)
    available = free - int(total * GPU_RESERVE_FRACTION)
    if still_to_allocate <= available:
        return None
    return Refusal(
        code="adapter_host_full",
        message=f"this slot still needs {_mib(still_to_allocate)} (gradients, optimizer moments) but its device has"
        f" {_mib(max(available, 0))} free beyond a {GPU_RESERVE_FRACTION:.0%} reserve; wait for a slot to"
        " end or use a smaller rank",
    )
