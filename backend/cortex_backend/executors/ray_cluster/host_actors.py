"""Adapter hosts on a Ray cluster: one actor per (host, device, base model) serving many sub-jobs as slots.

The actor is the one-sub-job actor (sub_job_actor.py) told `host_adapters` first, so its worker code runs
`serve_adapter_host` as a local adapter host process does (adapter_host.py): the base is built once on
that host and every slot's sub-job is a thread over shared base tensors. What differs from a sub-job's own
actor is on the head's side, here: every slot's messages go through the actor's one ordered inbox (one
sequence for the actor, each message addressed to its slot), and what the actor sends back is filed by
its slot: a slot's replies to its sub-job, a slot's tagged log lines to its job's logs (the host's own
lines to every slot), its `released` to the stop that waits for it. A slot that stops leaves the actor; the
actor stops with its last slot, so its memory and its Ray reservation go back with it. The actor's death
fails every slot it served (`worker_crashed`, or `host_lost` with its node), each resumable from its
checkpoints like any sub-job.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ...slot_logs import addressed_slots

# (cluster host, device id, base model): the sub-jobs one adapter-host actor serves.
HostActorKey = tuple[str, str, str]


@dataclass
class HostActor:
    key: HostActorKey
    host: Any  # hosts.Host: the cluster host (its Ray node) the actor runs on
    actor: Any
    # Where Ray placed the actor, once known (one entry; shared with every slot's record).
    placements: list[dict[str, Any]] = field(default_factory=list)
    # slot (base.slot_key) -> that sub-job's record (executor.ActorSubJob)
    slots: dict[str, Any] = field(default_factory=dict)
    sequence: int = 0
    stopping: bool = False
    pump: asyncio.Task | None = None
    # The base weights, as the slots report them when ready.
    base_bytes: int = 0

    @property
    def host_name(self) -> str:
        return self.host.name

    def next_sequence(self) -> int:
        """The actor's inbox keeps one order for every slot's messages."""
        self.sequence += 1
        return self.sequence - 1

    def send(self, header: dict[str, Any]) -> None:
        """A message for the host itself (not a slot's): its `host_adapters`, its last `shutdown`."""
        self.actor.send.remote(self.next_sequence(), header, b"", None)

    def describe(self) -> dict[str, Any]:
        host, device, base_model = self.key
        return {
            "host": host,
            "device": device,
            "base_model": base_model,
            "pid": int((self.placements[0] if self.placements else {}).get("pid") or 0),
            "slots": len(self.slots),
            "base_bytes": self.base_bytes,
            "slots_bytes": sum(sub.slot_bytes for sub in self.slots.values()),
        }


def lines_by_slot(
    slots: dict[str, Any], lines: list[tuple[float, str]]
) -> dict[str, list[tuple[float, str]]]:
    """An actor's captured lines, each under the slot that printed it; the host's own under every slot."""
    filed: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for at, tagged in lines:
        targets, line = addressed_slots(slots, tagged)
        for target in targets:
            filed[target].append((float(at), line))
    return filed
