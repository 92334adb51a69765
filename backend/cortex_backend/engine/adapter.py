"""The LoRA adapter as named tensors: read it, hash it, write it back, describe its shape.

Names are peft's state-dict names (the adapter name removed, as in adapter_model.safetensors), so a
checkpoint, a weight-sync payload and an exported adapter all speak of the same tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from cortex_nb.protocol.state_hash import state_hash

from .lora import ADAPTER_NAME, adapter_state
from .sharding import full, like


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The live adapter parameters by their state-dict names."""
    names = set(adapter_state(model))
    found = {}
    for name, parameter in model.named_parameters():
        canonical = name.replace(f".{ADAPTER_NAME}", "")
        if canonical in names:
            found[canonical] = parameter
    if set(found) != names:
        missing = sorted(names - set(found))[:3]
        raise RuntimeError(f"adapter tensors without a parameter: {missing}")
    return found


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A float32 copy of the adapter on the CPU, detached from training."""
    return {
        name: full(p.detach()).to(device="cpu", dtype=torch.float32).clone()
        for name, p in adapter_parameters(model).items()
    }


def tensor_hash(tensors: dict[str, torch.Tensor]) -> str:
    """The state hash (cortex_nb.state_hash) of torch tensors."""
    return state_hash(
        {name: t.detach().to(device="cpu", dtype=torch.float32).numpy() for name, t in tensors.items()}
    )


def layout(model: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """Each adapter tensor's dtype and shape: what another sub-job must match to take these weights."""
    return {
        name: {"dtype": str(p.dtype).replace("torch.", ""), "shape": list(p.shape)}
        for name, p in adapter_parameters(model).items()
    }


def as_stored(tensors: dict[str, torch.Tensor], dtypes: dict[str, str]) -> dict[str, torch.Tensor]:
    """What a sub-job whose parameters have `dtypes` ends up holding, as float32 (rounding included)."""
    return {name: t.to(getattr(torch, dtypes[name])).to(torch.float32) for name, t in tensors.items()}


@torch.no_grad()
def assign(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy new values into the adapter in place (each cast to its parameter's dtype and device)."""
    parameters = adapter_parameters(model)
    if set(tensors) != set(parameters):
        raise ValueError("the new adapter names differ from this model's")
    for name, value in tensors.items():
        if tuple(value.shape) != tuple(parameters[name].shape):
            raise ValueError(f"{name}: shape {list(value.shape)} does not fit {list(parameters[name].shape)}")
    for name, value in tensors.items():
        parameters[name].copy_(like(parameters[name], value))


def signature(model: torch.nn.Module, base_model: str) -> dict[str, Any]:
    """What decides whether weights fit this model: base model, rank, alpha and targeted modules."""
    config = model.peft_config[ADAPTER_NAME]
    modules = config.target_modules
    return {
        "base_model": base_model,
        "r": int(config.r),
        "lora_alpha": float(config.lora_alpha),
        "target_modules": sorted(modules) if not isinstance(modules, str) else modules,
        "parameters": int(sum(p.numel() for p in adapter_parameters(model).values())),
    }
