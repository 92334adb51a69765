"""Device admission: which job's sub-jobs run where, and who waits.

The queue is ordered by priority band, then submission time (`cortex_nb.protocol.priority`: waiting
raises a holder's band, so a low band is never starved). Admission walks that order and stops at the
first holder that does not fit, which blocks the ones behind it, so a large job is never starved by a
stream of small ones. Each sub-job takes one slot on one device; a job's
sub-jobs are kept on one device when they fit there (trainer and sampler share weights cheaply).

On a cluster (the Ray executor) devices come and go with their hosts (`set_devices`), and a device
serves only the models registered on its host: a job is placed only where every model it names is.

A device that hosts adapters (executors/base.py `Hosting`) has two pools: its process slots (`slots`,
`--sub-jobs-per-device`), which sub-jobs with a process of their own take, and its adapter-host slots
(`adapter_slots`, `--adapter-slots-per-device`), which sub-jobs that become slots of its adapter host take
(one device, an unquantized base): those share one process and one copy of the base, so far more of them
fit. What bounds them is memory: a job whose adapter-host slot did not fit in memory waits in the queue too
(room_waits.py): it stops the queue like a holder that does not fit, until a slot of its device frees.

Source runs wait in the same queue. A run that asks for N GPUs is `exclusive`: it takes N distinct
GPUs whole (every slot on each), since a user's script may use all of a device's memory. Holders of
a kind other than "job" are handed to that kind's admission listener instead of being returned.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from cortex_nb.protocol.priority import DEFAULT_AGING_S, DEFAULT_PRIORITY, effective_priority

from .devices import Device
from .room_waits import RoomWaits


class Scheduler:
    def __init__(
        self,
        devices: list[Device],
        aging_s: float = DEFAULT_AGING_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.devices = list(devices)
        self.aging_s = aging_s
        self.clock = clock
        self._used: dict[str, int] = {device.id: 0 for device in devices}
        self._adapter_used: dict[str, int] = {device.id: 0 for device in devices}
        # holder -> for each entry of its request, whether it may be an adapter-host slot (`enqueue`)
        self._hostable: dict[str, tuple[bool, ...]] = {}
        # placed holder -> for each entry of its placement, whether it took an adapter-host slot
        self._hosted: dict[str, tuple[bool, ...]] = {}
        # holder -> the models it needs (jobs; empty for source runs)
        self._models: dict[str, frozenset[str]] = {}
        self._placements: dict[str, list[Device]] = {}
        self._pending: OrderedDict[str, tuple[int, int]] = OrderedDict()
        # holder -> (priority, submitted at): the queue's order (`queue_order`)
        self._priority: dict[str, tuple[int, float]] = {}
        # Source runs ---------------------------------------------------------------------------
        self._kinds: dict[str, str] = {}
        self._exclusive: set[str] = set()
        # Holders that ended and whose workers are still stopping (their slots are not free yet).
        self._freeing: set[str] = set()
        # Jobs waiting for memory on an adapter host (not admitted until a slot of their device frees).
        self.room_waits = RoomWaits(clock)
        # Bumped by every change of the queue or the placements (what a cached view of them is keyed on).
        self.version = 0
        # kind -> called with (holder_id, placement) when a holder of that kind is admitted.
        self.admission_listeners: dict[str, Callable[[str, list[Device]], None]] = {}
        # Called with the first holder in line that did not fit, once `admit` has settled the queue
        # (preemption.py may make room for it).
        self.on_blocked: Callable[[str], None] | None = None

    @property
    def total_slots(self) -> int:
        return sum(device.slots for device in self.devices)

    def fits_ever(
        self,
        slots: int,
        min_memory_bytes: int = 0,
        exclusive: bool = False,
        models: frozenset[str] = frozenset(),
        hostable: tuple[bool, ...] = (),
    ) -> bool:
        """Whether the devices served now could ever hold this (were every other holder gone)."""
        eligible = [
            device
            for device in self.devices
            if self._has_memory(device, min_memory_bytes) and device.serves(models)
        ]
        if exclusive:
            return slots <= len([device for device in eligible if device.kind == "cuda"])
        whole = {device.id: (device.slots, device.adapter_slots) for device in eligible}
        return self._place_in(slots, eligible, whole, hostable) is not None

    def enqueue(
        self,
        holder_id: str,
        slots: int,
        min_memory_bytes: int = 0,
        *,
        kind: str = "job",
        exclusive: bool = False,
        models: frozenset[str] = frozenset(),
        priority: int = DEFAULT_PRIORITY,
        submitted_at: float | None = None,
        hostable: tuple[bool, ...] = (),
    ) -> None:
        """Queue a holder. `exclusive`: `slots` distinct GPUs, each taken whole (source runs on GPUs).
        `models`: only devices serving all of them are eligible. `priority` 0-9 and `submitted_at`
        (default: now) place it in the queue. `hostable`: for each of the `slots` entries, whether it
        becomes an adapter-host slot on a device that hosts (a missing entry: it does not)."""
        self.version += 1
        self._pending[holder_id] = (slots, min_memory_bytes)
        if any(hostable):
            self._hostable[holder_id] = tuple(hostable)
        self._priority[holder_id] = (priority, self.clock() if submitted_at is None else submitted_at)
        self._kinds[holder_id] = kind
        if models:
            self._models[holder_id] = frozenset(models)
        if exclusive:
            self._exclusive.add(holder_id)

    def withdraw(self, holder_id: str) -> None:
        """Forget a pending holder (cancelled before it started)."""
        self.version += 1
        self._pending.pop(holder_id, None)
        self._priority.pop(holder_id, None)
        self._kinds.pop(holder_id, None)
        self._exclusive.discard(holder_id)
        self._models.pop(holder_id, None)
        self._hostable.pop(holder_id, None)

    def is_pending(self, holder_id: str) -> bool:
        return holder_id in self._pending

    def priority_of(self, holder_id: str) -> tuple[int, int, float] | None:
        """(priority, effective priority now, submitted at) of a pending holder."""
        if holder_id not in self._priority:
            return None
        priority, submitted_at = self._priority[holder_id]
        return (
            priority,
            effective_priority(priority, self.clock() - submitted_at, self.aging_s),
            submitted_at,
        )

    def queue_order(self) -> list[str]:
        """Pending holders, first in line first: highest effective priority, then oldest submission (then
        the order they were queued in)."""
        now = self.clock()
        ranked = []
        for index, holder_id in enumerate(self._pending):
            priority, submitted_at = self._priority.get(holder_id, (DEFAULT_PRIORITY, now))
            band = effective_priority(priority, now - submitted_at, self.aging_s)
            ranked.append((-band, submitted_at, index, holder_id))
        ranked.sort()
        return [holder_id for *_, holder_id in ranked]

    def admit(self) -> list[tuple[str, list[Device]]]:
        """Place pending holders in queue order until the first that does not fit."""
        self.version += 1
        admitted = []
        others: list[tuple[str, str, list[Device]]] = []
        blocked: str | None = None
        waits_for_room = False
        for holder_id in self.queue_order():
            slots, min_memory_bytes = self._pending[holder_id]
            if self.room_waits.holds(holder_id):
                blocked, waits_for_room = holder_id, True
                break
            if holder_id in self._exclusive:
                placement = self._place_exclusive(slots, min_memory_bytes)
            else:
                placement = self._place(
                    slots,
                    min_memory_bytes,
                    self._models.get(holder_id, frozenset()),
                    self._hostable.get(holder_id, ()),
                )
            if placement is None:
                blocked = holder_id
                break
            hosted = self._hosted_entries(placement, self._hostable.pop(holder_id, ()))
            del self._pending[holder_id]
            self._priority.pop(holder_id, None)
            self._exclusive.discard(holder_id)
            self._models.pop(holder_id, None)
            for device, is_hosted in zip(placement, hosted, strict=True):
                (self._adapter_used if is_hosted else self._used)[device.id] += 1
            self._placements[holder_id] = placement
            self._hosted[holder_id] = hosted
            kind = self._kinds.pop(holder_id, "job")
            if kind == "job":
                admitted.append((holder_id, placement))
            else:
                others.append((kind, holder_id, placement))
        # Listeners run after the queue is settled: they may release or admit in turn.
        for kind, holder_id, placement in others:
            self.admission_listeners[kind](holder_id, placement)
        # Preemption frees device slots; a job waiting for memory needs a slot of its host freed instead.
        if blocked is not None and not waits_for_room and self.on_blocked is not None:
            self.on_blocked(blocked)
        return admitted

    def mark_freeing(self, holder_id: str) -> bool:
        """A placed holder ended and its workers are stopping: its slots stay held until `release`. False
        when it holds none or is already freeing."""
        self.version += 1
        if holder_id not in self._placements or holder_id in self._freeing:
            return False
        self._freeing.add(holder_id)
        return True

    def is_freeing(self, holder_id: str) -> bool:
        return holder_id in self._freeing

    def release(self, holder_id: str) -> bool:
        """Free a holder's slots; returns whether it held any."""
        self.version += 1
        self.withdraw(holder_id)
        self._freeing.discard(holder_id)
        placement = self._placements.pop(holder_id, None)
        if placement is None:
            return False
        hosted = self._hosted.pop(holder_id, (False,) * len(placement))
        for device, is_hosted in zip(placement, hosted, strict=True):
            (self._adapter_used if is_hosted else self._used)[device.id] -= 1
        self._forget_departed()
        return True

    def placed_holders(self) -> list[str]:
        """Holders placed on devices now, in the order they were admitted."""
        return list(self._placements)

    def placement(self, holder_id: str) -> list[Device] | None:
        return self._placements.get(holder_id)

    # why a holder waits ------------------------------------------------------------------------
    def pending_holders(self) -> list[str]:
        """Holders waiting, first in line first."""
        return self.queue_order()

    def request_of(self, holder_id: str) -> tuple[int, int, bool] | None:
        """(slots, min_memory_bytes, exclusive) a pending holder asks for."""
        if holder_id not in self._pending:
            return None
        slots, min_memory_bytes = self._pending[holder_id]
        return slots, min_memory_bytes, holder_id in self._exclusive

    def eligible_devices(
        self, min_memory_bytes: int = 0, exclusive: bool = False, models: frozenset[str] = frozenset()
    ) -> list[Device]:
        return [
            device
            for device in self.devices
            if self._has_memory(device, min_memory_bytes)
            and (not exclusive or device.kind == "cuda")
            and device.serves(models)
        ]

    def models_of(self, holder_id: str) -> frozenset[str]:
        """The models a pending holder needs its devices to serve (a cluster's hosts each serve some)."""
        return self._models.get(holder_id, frozenset())

    def models_restrict_placement(self, models: frozenset[str]) -> bool:
        """Whether some device does not serve `models` (a cluster's host without them), so a reason should
        name them."""
        return any(not device.serves(models) for device in self.devices)

    def slots_in_use(self, device: Device) -> int:
        return self._used.get(device.id, 0)

    def adapter_slots_in_use(self, device: Device) -> int:
        return self._adapter_used.get(device.id, 0)

    def waits_for_adapter_slots(self, holder_id: str, devices: list[Device]) -> bool:
        """Whether a pending holder's every entry would be an adapter-host slot on `devices` (so it waits for
        those, not for process slots)."""
        hostable = self._hostable.get(holder_id, ())
        slots = (self._pending.get(holder_id) or (0, 0))[0]
        return (
            bool(slots)
            and len(hostable) == slots
            and all(hostable)
            and any(device.adapter_slots for device in devices)
        )

    def would_fit(self, holder_id: str, without: list[str]) -> bool:
        """Whether a pending holder would be placed were the holders `without` gone (preemption.py asks)."""
        if holder_id not in self._pending:
            return False
        slots, min_memory_bytes = self._pending[holder_id]
        free = {device.id: (self._free(device), self._adapter_free(device)) for device in self.devices}
        for holder in without:
            placement = self._placements.get(holder, [])
            for device, is_hosted in zip(placement, self._hosted.get(holder, ()), strict=True):
                if device.id in free:
                    process, adapter = free[device.id]
                    free[device.id] = (process, adapter + 1) if is_hosted else (process + 1, adapter)
        exclusive = holder_id in self._exclusive
        eligible = self.eligible_devices(
            min_memory_bytes, exclusive, self._models.get(holder_id, frozenset())
        )
        if exclusive:
            idle = [device for device in eligible if free[device.id] == (device.slots, device.adapter_slots)]
            return len(idle) >= slots
        return self._place_in(slots, eligible, free, self._hostable.get(holder_id, ())) is not None

    def holders_on(self, devices: list[Device]) -> list[str]:
        """Holders placed on any of `devices`, in the order they were admitted."""
        ids = {device.id for device in devices}
        return [
            holder for holder, placement in self._placements.items() if any(d.id in ids for d in placement)
        ]

    def slots_held(self, holder_id: str, devices: list[Device], adapter: bool | None = None) -> int:
        """Slots a holder takes on `devices`: of both pools, or (`adapter`) adapter-host or process ones."""
        ids = {device.id for device in devices}
        placement = self._placements.get(holder_id, [])
        hosted = self._hosted.get(holder_id, (False,) * len(placement))
        return sum(
            1
            for device, is_hosted in zip(placement, hosted, strict=True)
            if device.id in ids and (adapter is None or adapter == is_hosted)
        )

    def _free(self, device: Device) -> int:
        return device.slots - self._used.get(device.id, 0)

    def _adapter_free(self, device: Device) -> int:
        return device.adapter_slots - self._adapter_used.get(device.id, 0)

    @staticmethod
    def _takes_adapter_slot(device: Device, hostable: tuple[bool, ...], index: int) -> bool:
        """Whether entry `index` of a request takes an adapter-host slot on `device` (else a process slot)."""
        return device.adapter_slots > 0 and index < len(hostable) and hostable[index]

    @classmethod
    def _hosted_entries(cls, placement: list[Device], hostable: tuple[bool, ...]) -> tuple[bool, ...]:
        """For each entry of a placement, whether it takes an adapter-host slot of its device."""
        return tuple(
            cls._takes_adapter_slot(device, hostable, index) for index, device in enumerate(placement)
        )

    @staticmethod
    def _has_memory(device: Device, min_memory_bytes: int) -> bool:
        return not min_memory_bytes or (device.memory_bytes or 0) >= min_memory_bytes

    def _place(
        self,
        slots: int,
        min_memory_bytes: int = 0,
        models: frozenset[str] = frozenset(),
        hostable: tuple[bool, ...] = (),
    ) -> list[Device] | None:
        eligible = self.eligible_devices(min_memory_bytes, models=models)
        free = {device.id: (self._free(device), self._adapter_free(device)) for device in eligible}
        return self._place_in(slots, eligible, free, hostable)

    @staticmethod
    def _place_in(
        slots: int,
        eligible: list[Device],
        free: dict[str, tuple[int, int]],
        hostable: tuple[bool, ...],
    ) -> list[Device] | None:
        """Where `slots` entries go given each device's free (process, adapter-host) slots: all on the one
        device with the most room when one holds them all (a job's sub-jobs share a base cheaply there), else
        each entry on the first device with room for it. An entry that is `hostable` takes an adapter-host
        slot on a device that hosts, a process slot elsewhere."""

        def needs(device: Device, entries: range) -> tuple[int, int]:
            hosted = sum(1 for index in entries if Scheduler._takes_adapter_slot(device, hostable, index))
            return len(entries) - hosted, hosted

        def room(device: Device) -> int:
            process, adapter = free[device.id]
            return process + adapter

        by_free = sorted(eligible, key=lambda device: -room(device))
        for device in by_free:
            process, adapter = needs(device, range(slots))
            if free[device.id][0] >= process and free[device.id][1] >= adapter:
                return [device] * slots
        left = dict(free)
        placement: list[Device] = []
        for index in range(slots):
            for device in by_free:
                process, adapter = left[device.id]
                hosted = Scheduler._takes_adapter_slot(device, hostable, index)
                if hosted and adapter > 0:
                    left[device.id] = (process, adapter - 1)
                elif not hosted and process > 0:
                    left[device.id] = (process - 1, adapter)
                else:
                    continue
                placement.append(device)
                break
            else:
                return None
        return placement

    def _place_exclusive(self, count: int, min_memory_bytes: int) -> list[Device] | None:
        """`count` distinct idle GPUs; the placement lists each once per slot, so release frees them whole."""
        idle = [
            device
            for device in self.devices
            if device.kind == "cuda"
            and self._has_memory(device, min_memory_bytes)
            and self._free(device) == device.slots
            and self._adapter_free(device) == device.adapter_slots
        ]
        if len(idle) < count:
            return None
        return [device for device in idle[:count] for _ in range(device.slots)]

    def capacity(self) -> dict:
        devices = []
        for device in self.devices:
            row = device.to_json()
            if device.models is not None:
                row["models"] = sorted(device.models)
            row["slots_in_use"] = self._used.get(device.id, 0)
            row["slots_available"] = self._free(device)
            row["adapter_slots_in_use"] = self._adapter_used.get(device.id, 0)
            row["adapter_slots_available"] = self._adapter_free(device)
            devices.append(row)
        return {
            "devices": devices,
            "slots_total": self.total_slots,
            "slots_in_use": sum(row["slots_in_use"] for row in devices),
            "slots_available": sum(row["slots_available"] for row in devices),
            "adapter_slots_total": sum(device.adapter_slots for device in self.devices),
            "adapter_slots_in_use": sum(row["adapter_slots_in_use"] for row in devices),
            "adapter_slots_available": sum(row["adapter_slots_available"] for row in devices),
            "pending": len(self._pending),
            "pending_slots": sum(slots for slots, _ in self._pending.values()),
            "hosts": self._hosts(devices),
        }

    # hosts that come and go (a cluster) ---------------------------------------------------------
    def set_devices(self, devices: list[Device]) -> None:
        """Serve these devices from now on. Holders placed on a device that is gone keep their count
        until released (the executor fails their sub-jobs); nothing new is placed there."""
        self.version += 1
        self.devices = list(devices)
        for device in devices:
            self._used.setdefault(device.id, 0)
            self._adapter_used.setdefault(device.id, 0)
        self._forget_departed()

    def _forget_departed(self) -> None:
        present = {device.id for device in self.devices}
        for device_id in [
            device_id
            for device_id, used in self._used.items()
            if device_id not in present and used <= 0 and self._adapter_used.get(device_id, 0) <= 0
        ]:
            del self._used[device_id]
            self._adapter_used.pop(device_id, None)

    def pending_that_never_fit(self, kind: str = "job") -> list[str]:
        """Pending holders of `kind` that no device served now could ever hold (their models are on no
        host, or too few slots are left)."""
        return [
            holder_id
            for holder_id, (slots, min_memory_bytes) in self._pending.items()
            if self._kinds.get(holder_id) == kind
            and not self.fits_ever(
                slots,
                min_memory_bytes,
                holder_id in self._exclusive,
                self._models.get(holder_id, frozenset()),
                self._hostable.get(holder_id, ()),
            )
        ]

    def models_served(self) -> frozenset[str] | None:
        """The models some device serves now (None: the devices serve every registered model)."""
        if any(device.models is None for device in self.devices):
            return None
        return frozenset().union(*(device.models for device in self.devices))

    @staticmethod
    def _hosts(devices: list[dict]) -> list[dict]:
        """Capacity per host: the per-device rows summed."""
        hosts: dict[str, dict] = {}
        for row in devices:
            host = hosts.setdefault(
                row["host"],
                {
                    "host": row["host"],
                    "devices": [],
                    "slots_total": 0,
                    "slots_in_use": 0,
                    "slots_available": 0,
                    "adapter_slots_total": 0,
                    "adapter_slots_available": 0,
                },
            )
            host["devices"].append(row["id"])
            host["slots_total"] += row["slots"]
            host["slots_in_use"] += row["slots_in_use"]
            host["slots_available"] += row["slots_available"]
            host["adapter_slots_total"] += row["adapter_slots"]
            host["adapter_slots_available"] += row["adapter_slots_available"]
            if "models" in row:
                host["models"] = row["models"]
        return list(hosts.values())
