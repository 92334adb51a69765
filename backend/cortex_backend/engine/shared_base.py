"""Base weights an adapter host shares among its slots, marked on the tensors themselves.

Every slot's module tree holds the very tensors of one base, so a write to them (an adapter merged into
them, say) would change every neighbour's model. The mark travels with the tensors into every slot's
tree; what would write to base weights checks it and refuses, and each LoRA layer over them refuses
peft's in-place merge.
"""

from __future__ import annotations

import itertools

import torch

MARK = "_cortex_shared_base"


class SharedBaseError(ValueError):
    """A write to base weights an adapter host shares (a merge) was asked for; a hosted slot runs its
    adapter unmerged."""


def mark_shared(model: torch.nn.Module) -> None:
    """Mark every parameter and buffer of `model` as an adapter host's shared base."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        setattr(tensor, MARK, True)


def is_shared(tensor: torch.Tensor) -> bool:
    return bool(getattr(tensor, MARK, False))


def shares_base(model: torch.nn.Module) -> bool:
    """Whether `model`'s base weights (its frozen parameters) are an adapter host's shared ones."""
    return any(is_shared(parameter) for parameter in model.parameters())


def forbid_merges(model: torch.nn.Module) -> int:
    """Make each LoRA layer of `model` refuse peft's merge (which writes W + BA into the base weight);
    returns how many layers now refuse."""
    from peft.tuners.lora import LoraLayer

    def refuse(*args, **kwargs):
        raise SharedBaseError(
            "this adapter's base weights are shared by an adapter host's slots; it runs unmerged"
        )

    layers = [module for module in model.modules() if isinstance(module, LoraLayer)]
    for layer in layers:
        layer.merge = refuse
    return len(layers)
