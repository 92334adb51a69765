"""Rank groups: the bookkeeping of a training sub-job across devices (`n_gpus` > 1), whichever executor runs
its ranks (local.py: one worker process per rank; ray_cluster/executor.py: one Ray actor per rank, placed
together by a placement group).

Every rank is told its place in the group's process group (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) in its `init`; the group is ready once every rank is; a failed start of any rank fails the
sub-job, once, naming the rank; the sub-job's ready info is rank 0's plus `ranks` (what each rank reported).
"""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass, field
from typing import Any

from .. import worker_messages as messages
from ..devices import Device
from .base import SubJobAssignment

# Of each rank's own ready info, what the sub-job's `ranks` shows per rank.
RANK_INFO_FIELDS = ("device_name", "base_bytes", "peak_memory_bytes", "peak_memory_kind")


def free_port(address: str = "127.0.0.1") -> int:
    """A port free on `address` now, for a rank group's rendezvous (rank 0 listens on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def shared_gpu_refusal(devices: tuple[Device, ...]) -> str | None:
    """Why a placement cannot run as ranks (two ranks on one GPU), or None when it can."""
    gpus = [device.id for device in devices if device.kind == "cuda"]
    if len(set(gpus)) == len(gpus):
        return None
    return (
        f"its {len(devices)} ranks were placed on {sorted(set(gpus))}: two ranks cannot share a GPU."
        " Start the backend with one slot per GPU to run sub-jobs across GPUs"
    )


def rank_inits(
    base: messages.Init, devices: tuple[Device, ...], master_addr: str, master_port: int
) -> list[messages.Init]:
    """Each rank's `init`: the sub-job's, with its device's environment and its place in the group."""
    rendezvous = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}
    return [
        dataclasses.replace(
            base,
            env={
                **device.worker_env(),
                **rendezvous,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(len(devices)),
            },
        )
        for rank, device in enumerate(devices)
    ]


@dataclass
class RankGroupState:
    """What the executor knows of a sub-job's ranks: which are ready, what each reported, whether the
    sub-job's end (a crash or a failed start) was already reported."""

    assignment: SubJobAssignment
    # What each rank reported about itself when ready (its shard's bytes, its memory after loading).
    rank_infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Set once the sub-job's end is reported: later exits and failures say nothing more.
    ended: bool = False

    @property
    def world_size(self) -> int:
        return len(self.assignment.rank_devices)

    def rank_ready(self, rank: int, info: dict[str, Any] | None) -> bool:
        """Note a rank's `ready`; True once, when the last rank is ready and the group has not ended."""
        already = len(self.rank_infos) == self.world_size
        self.rank_infos[rank] = info or {}
        return not already and len(self.rank_infos) == self.world_size and not self.ended

    def end(self) -> bool:
        """Mark the sub-job ended; True the first time only (the one time its end is reported)."""
        first = not self.ended
        self.ended = True
        return first

    def ready_info(self, members: list[tuple[int | None, str]]) -> dict[str, Any]:
        """The sub-job's ready info: rank 0's, with `ranks` (per rank its pid and device, as `members` lists
        them in rank order, and what it reported of itself)."""
        ranks = []
        for rank, (pid, device_id) in enumerate(members):
            own = self.rank_infos.get(rank, {})
            ranks.append(
                {"rank": rank, "pid": pid, "device": device_id}
                | {key: own[key] for key in RANK_INFO_FIELDS if key in own}
            )
        return {**self.rank_infos.get(0, {}), "ranks": ranks}

    @staticmethod
    def failed_start(rank: int, header: dict[str, Any]) -> dict[str, Any]:
        """A rank's `init_failed`, its message naming the rank."""
        return {**header, "message": f"rank {rank}: {header.get('message', '')}"}

    def crash_message(self, rank: int, pid: int | None, how: str, where: str = "") -> str:
        """Why the sub-job failed `worker_crashed` when one of its ranks died."""
        serving = f"(pid {pid}) " if pid is not None else ""
        return (
            f"rank {rank} of {self.world_size} {serving}serving {self.assignment.sub_job_id}{where} died ({how});"
            " every rank is stopped. See the job's logs; other jobs are unaffected."
        )
