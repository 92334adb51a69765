"""Wrap a base model with a peft LoRA adapter, initialised reproducibly from the sub-job's seed."""

from __future__ import annotations

from typing import Any

import torch

DEFAULT_LORA: dict[str, Any] = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
ADAPTER_NAME = "default"


def lora_config(spec: dict[str, Any]):
    from peft import LoraConfig

    merged = {**DEFAULT_LORA, **(spec or {})}
    return LoraConfig(
        r=int(merged["r"]),
        lora_alpha=float(merged["alpha"]),
        lora_dropout=float(merged["dropout"]),
        target_modules=merged["target_modules"],
        bias="none",
        task_type="CAUSAL_LM",
    )


def apply_lora(model: torch.nn.Module, spec: dict[str, Any], seed: int) -> torch.nn.Module:
    """LoRA A matrices are random: seed them so the in-process reference builds the same adapter."""
    from peft import get_peft_model

    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, lora_config(spec))
    finally:
        torch.random.set_rng_state(state)
    return peft_model


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable LoRA tensors by their peft names (as in adapter_model.safetensors). With LoRA on the output
    layer (`lm_head`, Tinker's train_unembed) peft would also copy the frozen base layer in; it is not ours."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model, save_embedding_layers=False)
