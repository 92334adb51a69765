"""Device admission: which job's sub-jobs run where, and who waits.

Strict first-in, first-out: a job that does not fit blocks the ones behind it, so a large job is
never starved by a stream of small ones. Each sub-job takes one slot on one device; a job's
sub-jobs are kept on one device when they fit there (trainer and sampler share weights cheaply).
"""

from __future__ import annotations

from collections import OrderedDict

from .devices import Device


class Scheduler:
    def __init__(self, devices: list[Device]) -> None:
        self.devices = devices
        self._used: dict[str, int] = {device.id: 0 for device in devices}
        self._placements: dict[str, list[Device]] = {}
        self._pending: OrderedDict[str, tuple[int, int]] = OrderedDict()

    @property
    def total_slots(self) -> int:
        return sum(device.slots for device in self.devices)

    def fits_ever(self, slots: int, min_memory_bytes: int = 0) -> bool:
        eligible = [device for device in self.devices if self._has_memory(device, min_memory_bytes)]
        return slots <= sum(device.slots for device in eligible)

    def enqueue(self, holder_id: str, slots: int, min_memory_bytes: int = 0) -> None:
        self._pending[holder_id] = (slots, min_memory_bytes)

    def withdraw(self, holder_id: str) -> None:
        """Forget a pending holder (cancelled before it started)."""
        self._pending.pop(holder_id, None)

    def is_pending(self, holder_id: str) -> bool:
        return holder_id in self._pending

    def admit(self) -> list[tuple[str, list[Device]]]:
        """Place pending holders in order until the first that does not fit."""
        admitted = []
        while self._pending:
            holder_id, (slots, min_memory_bytes) = next(iter(self._pending.items()))
            placement = self._place(slots, min_memory_bytes)
            if placement is None:
                break
            self._pending.popitem(last=False)
            for device in placement:
                self._used[device.id] += 1
            self._placements[holder_id] = placement
            admitted.append((holder_id, placement))
        return admitted

    def release(self, holder_id: str) -> bool:
        """Free a holder's slots; returns whether it held any."""
        self.withdraw(holder_id)
        placement = self._placements.pop(holder_id, None)
        if placement is None:
            return False
        for device in placement:
            self._used[device.id] -= 1
        return True

    def placement(self, holder_id: str) -> list[Device] | None:
        return self._placements.get(holder_id)

    def _free(self, device: Device) -> int:
        return device.slots - self._used[device.id]

    @staticmethod
    def _has_memory(device: Device, min_memory_bytes: int) -> bool:
        return not min_memory_bytes or (device.memory_bytes or 0) >= min_memory_bytes

    def _place(self, slots: int, min_memory_bytes: int = 0) -> list[Device] | None:
        eligible = [device for device in self.devices if self._has_memory(device, min_memory_bytes)]
        by_free = sorted(eligible, key=lambda device: -self._free(device))
        if by_free and self._free(by_free[0]) >= slots:
            return [by_free[0]] * slots
        placement: list[Device] = []
        for device in by_free:
            placement.extend([device] * min(self._free(device), slots - len(placement)))
        return placement if len(placement) == slots else None

    def capacity(self) -> dict:
        devices = []
        for device in self.devices:
            row = device.to_json()
            row["slots_in_use"] = self._used[device.id]
            row["slots_available"] = self._free(device)
            devices.append(row)
        return {
            "devices": devices,
            "slots_total": self.total_slots,
            "slots_in_use": sum(self._used.values()),
            "slots_available": self.total_slots - sum(self._used.values()),
            "pending": len(self._pending),
            "pending_slots": sum(slots for slots, _ in self._pending.values()),
        }
