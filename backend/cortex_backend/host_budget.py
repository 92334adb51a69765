"""Admission by bytes on an adapter host: a new slot is refused when what it adds would not fit.

The slot is measured, not estimated: once its adapter is built (before any step), its bytes are exact,
and what it will add later (gradients and the optimizer's two moments, each the adapter's size) is known.
With `--adapter-host-memory BYTES` the host keeps its base and slots within that many bytes; without it,
on a GPU, the slot must fit in the device's free memory (which counts every process on the device) less
a reserve for activations; on a CPU without the option nothing is checked.

A slot that would fit on an emptier host waits: its job goes back to the queue until a slot of that device
frees (room_waits in scheduler.py). One that could not fit even beside the base alone fails at once.

On a GPU, a training slot that does not fit with its optimizer moments is tried again with them in host
memory between steps (engine/optimizer_offload.py): it then holds its adapter and gradients on the device,
and the host keeps room for the moments of one stepping slot (slots step one at a time), the largest of its
offloaded slots' (`offloaded_slot`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Kept free on a GPU for activations and the allocator's slack when no budget is given.
GPU_RESERVE_FRACTION = 0.05


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str
    # True when the slot would fit once other slots end (its job waits in the queue); False when it could
    # never fit, not even beside the base alone (its job fails).
    fits_later: bool = False


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
    same_job_bytes: int = 0,
) -> Refusal | None:
    """None when the slot fits. `slot_bytes`: all it will hold; `allocated_bytes`: what of that is already
    allocated (its adapter); `device_free`: (free, total) bytes of the device, or None off a GPU;
    `same_job_bytes`: what of `other_slots_bytes` is its own job's other sub-jobs (they always come along,
    so they count towards whether it could ever fit)."""
    if budget_bytes is not None:
        used = base_bytes + other_slots_bytes
        if used + slot_bytes <= budget_bytes:
            return None
        if base_bytes + same_job_bytes + slot_bytes > budget_bytes:
            return Refusal(
                code="adapter_host_full",
                message=f"this slot needs {_mib(slot_bytes)} (adapter, gradients, optimizer moments); beside the"
                f" base ({_mib(base_bytes)})"
                + (f" and its own job's other sub-jobs ({_mib(same_job_bytes)})" if same_job_bytes else "")
                + f" it can never fit in its adapter host's {_mib(budget_bytes)} budget"
                " (--adapter-host-memory), not even on an otherwise empty host. Use a smaller rank or fewer"
                " target modules, or ask the operator for a larger budget",
            )
        return Refusal(
            code="adapter_host_full",
            message=f"waiting for adapter-host memory: this slot needs {_mib(slot_bytes)} (adapter, gradients,"
            f" optimizer moments); its adapter host holds the base ({_mib(base_bytes)}) and {other_slots}"
            f" other slot(s) ({_mib(other_slots_bytes)}) of its {_mib(budget_bytes)} budget"
            " (--adapter-host-memory). It starts once a slot on that host ends",
            fits_later=True,
        )
    if device_free is None:
        return None
    free, total = device_free
    still_to_allocate = max(0, slot_bytes - allocated_bytes)
    reserve = int(total * GPU_RESERVE_FRACTION)
    available = free - reserve
    if still_to_allocate <= available:
        return None
    if base_bytes + same_job_bytes + slot_bytes > total - reserve:
        return Refusal(
            code="adapter_host_full",
            message=f"this slot needs {_mib(slot_bytes)} (adapter, gradients, optimizer moments) beside its base"
            f" ({_mib(base_bytes)}) but its device holds {_mib(total)} less a {GPU_RESERVE_FRACTION:.0%}"
            " reserve: it can never fit there. Use a smaller rank or fewer target modules",
        )
    return Refusal(
        code="adapter_host_full",
        message=f"waiting for device memory: this slot still needs {_mib(still_to_allocate)} (gradients,"
        f" optimizer moments) but its device has {_mib(max(available, 0))} free beyond a"
        f" {GPU_RESERVE_FRACTION:.0%} reserve (its adapter host holds the base, {_mib(base_bytes)}, and"
        f" {other_slots} other slot(s), {_mib(other_slots_bytes)}). It starts once a slot on that device ends",
        fits_later=True,
    )


def offloaded_slot(adapter_bytes: int, moments_reserve: int) -> tuple[int, int]:
    """(device bytes an offloaded training slot adds, the host's reserve for one stepping slot's moments
    after it): its adapter and gradients, and however much its two moments exceed the reserve so far."""
    moments = 2 * adapter_bytes
    return 2 * adapter_bytes + max(0, moments - moments_reserve), max(moments, moments_reserve)


def admit_slot(
    check: Callable[[int], Refusal | None],
    slot_bytes: int,
    adapter_bytes: int,
    training: bool,
    can_offload: bool,
    moments_reserve: int,
) -> tuple[Refusal | None, bool]:
    """(refusal or None, whether to offload its optimizer moments). `check(bytes)`: `check_slot` for a slot
    adding that many bytes. A training slot that does not fit with its moments on the device is tried with
    them in host memory where that helps (`can_offload`: a GPU); a refusal then is the kinder of the two."""
    refusal = check(slot_bytes)
    if refusal is None or not training or not can_offload:
        return refusal, False
    offloaded = check(offloaded_slot(adapter_bytes, moments_reserve)[0])
    if offloaded is None:
        return None, True
    return (offloaded if offloaded.fits_later and not refusal.fits_later else refusal), False
