"""Data parallelism over the ranks of a sub-job across devices (engine/sharding.py).

Every rank receives the whole batch; each computes only its contiguous slice of the datums (rows), cut so the
slices hold about equal numbers of tokens. Every loss the trainer serves is a sum of per-datum terms, so the
sum of the ranks' slice gradients is the whole batch's gradient; FSDP averages gradients over the ranks, so
each rank's backward is scaled by the world size to make that average the sum. A rank whose slice is empty
(fewer datums than ranks) still runs a pass, on one datum with zero weight, so it takes part in every
all-gather and reduce-scatter and nothing waits for it. Per-datum outputs (logprobs, routed experts) are put
back together in the batch's order on every rank, so replies are what one process gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import sharding
from .errors import OperationError
from .memory import peak_memory


def token_counts(tensors: dict[str, np.ndarray]) -> list[int]:
    """Each datum's tokens: its attention mask's ones, or the padded length when there is no mask."""
    input_ids = tensors["input_ids"]
    mask = tensors.get("attention_mask")
    if mask is None:
        return [int(input_ids.shape[1])] * int(input_ids.shape[0])
    return [int(count) for count in (np.asarray(mask) != 0).sum(axis=1)]


def contiguous_slices(counts: list[int], world: int) -> list[tuple[int, int]]:
    """`world` contiguous (start, stop) row ranges, in rank order, with about equal token sums: each cut is the
    prefix boundary nearest its share of the tokens (a tie goes to the later boundary, so the first ranks get
    the datums when there are fewer datums than ranks)."""
    prefix = np.concatenate([[0], np.cumsum(counts, dtype=np.float64)])
    total = prefix[-1]
    cuts = [0]
    for share in range(1, world):
        distance = np.abs(prefix - total * share / world)
        nearest = len(prefix) - 1 - int(np.argmin(distance[::-1]))
        cuts.append(max(nearest, cuts[-1]))
    cuts.append(len(counts))
    return [(cuts[rank], cuts[rank + 1]) for rank in range(world)]


@dataclass
class Share:
    """This rank's part of one batch."""

    rows: int  # the whole batch's datums
    start: int
    stop: int
    world: int

    @property
    def split(self) -> bool:
        return self.world > 1

    @property
    def empty(self) -> bool:
        return self.stop == self.start

    @property
    def datums(self) -> int:
        return self.stop - self.start

    @property
    def gradient_scale(self) -> float:
        """What this rank's loss is multiplied by before backward: FSDP's mean over ranks becomes the sum, and
        an empty rank's stand-in pass adds nothing."""
        return 0.0 if self.empty else float(self.world)

    def computed_rows(self) -> tuple[int, int]:
        """The rows this rank runs: its slice, or the first datum as an empty rank's stand-in."""
        return (0, 1) if self.empty else (self.start, self.stop)

    def local(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start, stop = self.computed_rows()
        return {name: value[start:stop] for name, value in tensors.items()}

    def local_replay(self, replay: np.ndarray | None) -> np.ndarray | None:
        """Recorded routes are (layers, batch, tokens, top_k): this rank's rows of them."""
        if replay is None:
            return None
        start, stop = self.computed_rows()
        return replay[:, start:stop]

    def assemble(self, local: torch.Tensor, axis: int = 0) -> torch.Tensor:
        """The whole batch's tensor on every rank from each rank's rows along `axis` (a sum of zero-filled
        copies, exact since each entry has one contributor; an empty rank contributes only zeros)."""
        if not self.split:
            return local
        import torch.distributed as dist

        shape = list(local.shape)
        shape[axis] = self.rows
        whole = torch.zeros(shape, dtype=local.dtype, device=local.device)
        if not self.empty:
            whole.narrow(axis, self.start, self.datums).copy_(local)
        dist.all_reduce(whole)
        return whole

    def agree(self, error: Exception | None, device: torch.device) -> None:
        """Raise on every rank when the loss failed on any rank's slice, before any backward (the others would
        wait in its collectives); the first failed rank's code and message, so rank 0's reply carries them."""
        if not self.split:
            if error is not None:
                raise error
            return
        import torch.distributed as dist

        failed = [
            rank for rank, (flag,) in enumerate(gather_counts([int(error is not None)], device)) if flag
        ]
        if not failed:
            return
        mine = None
        if error is not None:
            code = error.code if isinstance(error, OperationError) else "operation_failed"
            message = (
                error.message if isinstance(error, OperationError) else f"{type(error).__name__}: {error}"
            )
            mine = (code, message)
        every: list[tuple[str, str] | None] = [None] * self.world
        dist.all_gather_object(every, mine)
        code, message = every[failed[0]]
        raise OperationError(code, f"rank {failed[0]} of {self.world}: {message}")


def share_of(tensors: dict[str, np.ndarray]) -> Share:
    """This rank's share of a batch (the whole batch in a sub-job of one rank)."""
    rows = int(tensors["input_ids"].shape[0])
    world = sharding.world_size()
    if world == 1:
        return Share(rows, 0, rows, 1)
    start, stop = contiguous_slices(token_counts(tensors), world)[sharding.rank()]
    return Share(rows, start, stop, world)


def gather_counts(values: list[int], device: torch.device) -> list[list[int]]:
    """Each rank's `values` (the same number on every rank), in rank order, on every rank."""
    import torch.distributed as dist

    mine = torch.tensor(values, dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(sharding.world_size())]
    dist.all_gather(every, mine)
    return [[int(value) for value in row.tolist()] for row in every]


def rank_shares(share: Share, tensors: dict[str, np.ndarray], device: torch.device) -> list[dict[str, Any]]:
    """What each rank computed of this batch and its memory peak: `datums` and `tokens` (positions, padding
    included, as `tokens:sum` counts them; they sum to the batch's), in rank order."""
    length = int(tensors["input_ids"].shape[1])
    memory = peak_memory(device)
    rows = gather_counts([share.datums, share.datums * length, int(memory["peak_memory_bytes"])], device)
    return [
        {
            "rank": rank,
            "datums": datums,
            "tokens": tokens,
            "peak_memory_bytes": peak,
            "peak_memory_kind": memory["peak_memory_kind"],
        }
        for rank, (datums, tokens, peak) in enumerate(rows)
    ]


def rank_memory(device: torch.device) -> list[dict[str, Any]]:
    """Each rank's memory peak of the current operation, in rank order."""
    memory = peak_memory(device)
    rows = gather_counts([int(memory["peak_memory_bytes"])], device)
    return [
        {"rank": rank, "peak_memory_bytes": peak, "peak_memory_kind": memory["peak_memory_kind"]}
        for rank, (peak,) in enumerate(rows)
    ]
