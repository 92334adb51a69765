"""A training sub-job over several ranks: torch FSDP2 (`fully_shard`) over the base and the adapter.

Every rank of a sub-job receives the same requests (executors/local.py sends each to all of them), computes
its slice of each batch (engine/data_parallel.py), and takes part in the same collectives; only rank 0's
replies reach the service. FSDP2 keeps
each parameter, its gradient and its optimizer moments as a shard (a DTensor) on each rank and gathers a
layer's weights only while that layer runs. Code that reads or writes whole tensors (checkpoints, weight
sync) goes through `full` and `like`, which are plain pass-throughs in a sub-job of one rank.
"""

from __future__ import annotations

import datetime
import os

import torch

# A collective waits this long for a rank that is gone before it raises (the executor kills the rest sooner).
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_sharded() -> bool:
    return world_size() > 1


def is_writer() -> bool:
    """Whether this rank writes files (rank 0, or the only rank): the others gather, then leave it be."""
    return rank() == 0


def start_process_group(device: torch.device) -> None:
    """Join the sub-job's process group (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE set by the executor):
    NCCL between GPUs, gloo between CPU ranks."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)


def shard(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """FSDP2 over each transformer block (the classes transformers names unsplittable), then the root, so a
    rank holds one block's full weights at a time."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world_size(),))
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    block_classes = set(getattr(base, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in block_classes:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (an all-gather of a shard; every rank must call it in turn)."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def like(target: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`value` (a whole tensor, the same on every rank) laid out as `target` is: this rank's shard of it, cut
    locally (no collective: every rank already holds the whole value)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(target, DTensor):
        return value
    return distribute_tensor(
        value.to(device=target.device, dtype=target.dtype),
        target.device_mesh,
        target.placements,
        src_data_rank=None,
    )


def describe() -> dict[str, int]:
    return {"world_size": world_size(), "rank": rank()}
