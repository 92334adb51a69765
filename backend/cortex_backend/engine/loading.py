"""Build the base model for a sub-job on its device, in the precision that suits the device."""

from __future__ import annotations

import torch

from ..models import TINY_CONFIG, TINY_HEAD_SCALE, TINY_SEED, ModelInfo
from .quantize import bitsandbytes_config, quantize_base, uses_bitsandbytes


def pick_device() -> torch.device:
    """The worker sees only its own GPU (CUDA_VISIBLE_DEVICES), or none."""
    return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")


def pick_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPUs that support it, fp32 on CPU (exact parity with in-process references)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def build_tiny() -> torch.nn.Module:
    """The built-in model: the same random weights every time, from a fixed seed, in fp32.

    The output head is scaled up from the usual init: with a frozen random head at std 0.02, logits
    stay nearly flat whatever the adapter learns, and LoRA could never make a confident prediction.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = {key: value for key, value in TINY_CONFIG.items() if key not in ("architectures", "model_type")}
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(LlamaConfig(**config))
    finally:
        torch.random.set_rng_state(state)
    with torch.no_grad():
        model.lm_head.weight.mul_(TINY_HEAD_SCALE)
    return model


def load_base_model(info: ModelInfo, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The base in the device's precision, or quantized where the operator registered it so (QLoRA)."""
    if uses_bitsandbytes(info.quantization, device, info.kind == "local"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(info.path),
            trust_remote_code=False,
            use_safetensors=True,
            dtype=dtype,
            attn_implementation="sdpa",
            quantization_config=bitsandbytes_config(info.quantization, dtype),
            device_map={"": device.index or 0},
        )
        model.config.use_cache = True
        return model
    if info.kind == "builtin":
        model = build_tiny()
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(info.path),
            trust_remote_code=False,
            use_safetensors=True,
            dtype=torch.float32,
            attn_implementation="sdpa",
        )
    model.to(device=device, dtype=dtype)
    if info.quantization:
        quantize_base(model, info.quantization)
    model.config.use_cache = True
    return model
