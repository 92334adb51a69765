"""Requests that run on a saved adapter instead of the sub-job's live one.

A `generate` or `forward` may name a checkpoint (or the bare base model). Its adapter tensors are read once,
checked against the manifest, kept on the device (the least recently used dropped first), and swapped into
the model for that one request; the live adapter (and a trainer's gradients and optimizer) is back in place
before the next request runs. So any sub-job of the same base model and LoRA shape serves many saved adapters
from one copy of the base, and a checkpoint never changes once written: sampling from it is a snapshot.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors

from .adapter import adapter_parameters, assign
from .checkpoint import ADAPTER_WEIGHTS, read_verified
from .errors import OperationError
from .model_state import ModelState

BASE = "base"
CACHED_ADAPTERS = 8


class SavedAdapters:
    def __init__(self, capacity: int = CACHED_ADAPTERS) -> None:
        self.capacity = capacity
        self._cache: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()
        self.loads = 0

    def tensors(self, state: ModelState, adapter: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The checkpoint's adapter on this sub-job's device, from the cache or read (verified) from disk."""
        key = adapter["key"]
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        data = read_verified(Path(adapter["directory"]), adapter["manifest"]["files"], ADAPTER_WEIGHTS)
        live = adapter_parameters(state.model)
        loaded = load_tensors(data)
        if set(loaded) != set(live) or any(tuple(loaded[n].shape) != tuple(live[n].shape) for n in loaded):
            raise OperationError(
                "incompatible_adapter", f"checkpoint {key}'s adapter does not fit this sub-job's adapter"
            )
        tensors = {
            name: value.to(device=live[name].device, dtype=live[name].dtype) for name, value in loaded.items()
        }
        self._cache[key] = tensors
        self.loads += 1
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return tensors

    @contextlib.contextmanager
    def applied(self, state: ModelState, adapter: dict[str, Any] | str | None) -> Iterator[None]:
        """Run the body with `adapter`: None = the live adapter, "base" = none, else a checkpoint's.

        Always by writing the adapter's tensors in place (zeros for "base": a zero adapter adds nothing), so an
        engine that merges the adapter into its weights sees the change like any other (torch counts the write)."""
        if adapter is None:
            yield
            return
        live = {
            name: parameter.detach().clone() for name, parameter in adapter_parameters(state.model).items()
        }
        saved = (
            {name: torch.zeros_like(value) for name, value in live.items()}
            if adapter == BASE
            else self.tensors(state, adapter)
        )
        assign(state.model, saved)
        try:
            yield
        finally:
            assign(state.model, live)
