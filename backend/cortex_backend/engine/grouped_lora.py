"""One forward pass over the rows of several adapter-host slots, each row through its own slot's LoRA.

An adapter host's slots are module trees over one base's tensors (adapter_host.py), each with its own
peft LoRA layers. To decode several slots' requests together, one tree (the *driver*) runs the pass, and
each layer that carries LoRA in any slot computes the base projection once for every row, then adds to
each slot's rows that slot's own LoRA product: `B(A(x_rows)) * scaling`, as peft's `lora.Linear` does.
Slots may differ in rank, alpha and targets (a slot without LoRA on a layer adds nothing there).

Only plain LoRA on linear layers groups (`groupable`): DoRA, LoRA on embeddings, or a module a slot
owns outright would need more than one added product, and run alone. The base projection over more rows
rounds like any larger batch: logprobs agree with the slot alone to float rounding, tokens as they do
for the batched requests of one sub-job (sample_batching.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .shared_base import is_shared


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Every peft LoRA layer of `model` (the transformers model under the peft wrapper), by module name."""
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def groupable(model: torch.nn.Module) -> bool:
    """Whether `model`'s adapter is plain LoRA on linear layers only, and nothing else of its own."""
    from peft.tuners.lora import Linear as linear

    layers = lora_layers(model)
    if not layers:
        return False
    for layer in layers.values():
        if type(layer) is not linear or any(layer.use_dora.values()) or getattr(layer, "lora_variant", None):
            return False
    own = {name for name, parameter in model.named_parameters() if not is_shared(parameter)}
    return all(".lora_A." in name or ".lora_B." in name for name in own)


@dataclass(frozen=True)
class SlotRows:
    """One slot's part of a grouped pass: its model, and how many rows it has in the prefill (distinct
    prompts) and in decoding (prompts x samples)."""

    model: torch.nn.Module
    prefill_rows: int
    decode_rows: int


def _row_counts(groups: list[SlotRows], batch: int) -> list[int]:
    """Each group's rows in a batch of `batch` rows: the prefill's or decoding's."""
    for field in ("prefill_rows", "decode_rows"):
        counts = [getattr(group, field) for group in groups]
        if sum(counts) == batch:
            return counts
    raise ValueError(f"a grouped LoRA pass got {batch} rows; its slots have {groups}")


def _lora_product(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """What `layer` (a peft lora.Linear) adds to its base output for input `x`, as its own forward adds it."""
    added = None
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A.keys():
            continue
        lora_A, lora_B = layer.lora_A[adapter], layer.lora_B[adapter]
        product = (
            lora_B(lora_A(layer.lora_dropout[adapter](x.to(lora_A.weight.dtype)))) * layer.scaling[adapter]
        )
        added = product if added is None else added + product
    return added


def _grouped_forward(
    base: Callable[..., torch.Tensor], layers: list[torch.nn.Module | None], groups: list[SlotRows]
):
    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        result = base(x, *args, **kwargs)
        dtype = result.dtype
        counts = _row_counts(groups, x.shape[0])
        # split, not slices: split's backward joins the rows' gradients once, where each slice's would fill
        # a whole-batch tensor of zeros. (Adding into the rows in place is slower still: its backward
        # copies the whole gradient once per slot.)
        parts = []
        for layer, rows, inputs in zip(layers, result.split(counts), x.split(counts), strict=True):
            added = None if layer is None or layer.disable_adapters else _lora_product(layer, inputs)
            parts.append(rows if added is None else rows + added)
        return torch.cat(parts).to(dtype)

    return forward


@contextlib.contextmanager
def grouped(driver: torch.nn.Module, groups: list[SlotRows]) -> Iterator[None]:
    """While open, a forward of `driver` (one of the slots' transformers models) runs each group's rows
    through that group's LoRA layers. The groups' models are trees over the driver's base tensors."""
    per_group = [lora_layers(group.model) for group in groups]
    per_driver = lora_layers(driver)
    names = sorted(set().union(*per_group))
    modules = dict(driver.named_modules())
    patched = []
    try:
        for name in names:
            target = modules[name]
            # The driver's LoRA layer computes its base layer; a layer the driver has no LoRA on, itself.
            base = target.get_base_layer() if name in per_driver else target.forward
            target.forward = _grouped_forward(base, [layers.get(name) for layers in per_group], groups)
            patched.append(target)
        yield
    finally:
        for target in patched:
            del target.forward
