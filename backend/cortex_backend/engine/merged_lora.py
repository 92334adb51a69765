"""A sampler's LoRA adapter merged into its base weights, kept in step with the adapter.

Unmerged, every targeted layer runs three matmuls and peft's bookkeeping per token; merged, one. A
sampling sub-job only runs inference, so its base weights can hold W + scale * B @ A. A trainer's
never do (it needs W and the adapter apart to train).

The adapter tensors stay where weight sync, checkpoint loads and the state hash expect them; the base
weights are re-merged from a kept copy of the originals whenever any adapter tensor changed (torch
counts in-place writes to a tensor in its `_version`), so merges never accumulate rounding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .adapter import adapter_parameters
from .lora import ADAPTER_NAME
from .shared_base import SharedBaseError, is_shared


def _lora_layers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """(parent, attribute, LoRA layer) for every LoRA layer of the model."""
    from peft.tuners.lora import LoraLayer

    found = []
    for parent in model.modules():
        for attribute, child in parent.named_children():
            if isinstance(child, LoraLayer):
                found.append((parent, attribute, child))
    return found


def _base_parameter(layer: torch.nn.Module) -> torch.Tensor:
    """The base tensor a LoRA layer merges into: a linear layer's `weight`, or the parameter a peft
    `ParamWrapper` adapts (an MoE's fused experts or router, which `all-linear` targets on Mixtral)."""
    return getattr(layer.get_base_layer(), getattr(layer, "parameter_name", None) or "weight")


class MergedLoRA:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.places = _lora_layers(model)
        self.layers = [layer for _, _, layer in self.places]
        if any(is_shared(_base_parameter(layer)) for layer in self.layers):
            # An adapter host's slots all hold these very tensors: merging here would change every neighbour.
            raise SharedBaseError(
                "this model's base weights are shared by an adapter host's slots; its sampler runs unmerged"
            )
        if any(layer.merged_adapters for layer in self.layers):
            # Its base weights already hold W + BA: taken as the originals, every merge would add BA again.
            raise ValueError(
                "this model's base weights already hold a merged adapter; merge it through one view"
            )
        self.parameters = list(adapter_parameters(model).values())
        # The original base weights, on the host: GPU memory holds only the merged copy.
        self.originals = [_base_parameter(layer).detach().to("cpu", copy=True) for layer in self.layers]
        self.merged_versions: tuple[int, ...] | None = None
        self.merges = 0

    def _versions(self) -> tuple[int, ...]:
        return tuple(parameter._version for parameter in self.parameters)

    @torch.no_grad()
    def ensure_current(self) -> bool:
        """Merge the adapter as it is now, unless that is what the base weights already hold."""
        versions = self._versions()
        if versions == self.merged_versions:
            return False
        for layer, original in zip(self.layers, self.originals, strict=True):
            _base_parameter(layer).copy_(original)
            layer.merged_adapters.clear()
            layer.merge(adapter_names=[ADAPTER_NAME])
        self.merged_versions = versions
        self.merges += 1
        return True

    @contextlib.contextmanager
    def bare(self) -> Iterator[None]:
        """The merged base layers in place of peft's wrappers, for a generate call: a merged wrapper
        only forwards to its base layer, at a Python call's cost per layer and token."""
        self.ensure_current()
        try:
            for parent, attribute, layer in self.places:
                setattr(parent, attribute, layer.get_base_layer())
            yield
        finally:
            for parent, attribute, layer in self.places:
                setattr(parent, attribute, layer)
