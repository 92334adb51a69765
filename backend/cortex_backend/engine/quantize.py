"""Quantized base models (QLoRA): the frozen base weights held in 4-bit NF4 or 8-bit integers.

Only the base's linear layers are quantized; the embeddings, norms and output head stay in the model's
precision, and the LoRA adapter and its optimizer state are always full precision (peft computes
``base(x) + scale * B(A(x))`` with the base dequantized on the fly). Two back ends:

- bitsandbytes on CUDA for a model loaded from a local directory: NF4 with double quantization and the
  device's compute dtype (bf16), the QLoRA recipe; int8 as LLM.int8.
- torchao elsewhere (CPU, or the built-in model): ``NF4Tensor`` weights (64-value blocks, double-quantized
  scalers) or int8 weight-only tensors. Slower than bitsandbytes kernels, but the same numerics class, and
  it runs on this project's CPU-only test machines.

A layer whose weight cannot be split into whole NF4 blocks keeps its precision (said in ``describe``).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from cortex_nb.protocol.quantization import QUANTIZATIONS

NF4_BLOCK = 64
NF4_SCALER_BLOCK = 256

__all__ = ["QUANTIZATIONS", "bitsandbytes_config", "quantize_base", "quantized_bytes", "uses_bitsandbytes"]


def uses_bitsandbytes(kind: str | None, device: torch.device, is_local_dir: bool) -> bool:
    """bitsandbytes quantizes at load time, from the model's files, and only on CUDA."""
    if not kind or device.type != "cuda" or not is_local_dir:
        return False
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return False
    return True


def bitsandbytes_config(kind: str, compute_dtype: torch.dtype):
    """transformers' loading config for the QLoRA recipe (NF4 + double quantization) or LLM.int8."""
    from transformers import BitsAndBytesConfig

    if kind == "nf4":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def _quantizable(name: str, module: torch.nn.Module) -> bool:
    # The output head stays in full precision: its logits are what losses and logprobs read.
    return isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] != "lm_head"


def _torchao():
    # torchao prints a line for each optional GPU kernel library it cannot load on import; none are used here.
    import logging

    logging.getLogger("torchao").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchao.quantization as quantization
    return quantization


@torch.no_grad()
def quantize_base(model: torch.nn.Module, kind: str) -> dict[str, Any]:
    """Quantize the base's linear layers in place with torchao; return what was done."""
    if kind not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {kind!r}; use one of {list(QUANTIZATIONS)}")
    quantization = _torchao()
    kept: list[str] = []
    if kind == "int8":
        quantization.quantize_(
            model, quantization.Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: _quantizable(fqn, m)
        )
    else:
        for name, module in model.named_modules():
            if not _quantizable(name, module):
                continue
            blocks, remainder = divmod(module.weight.numel(), NF4_BLOCK)
            if remainder:
                kept.append(name)
                continue
            weight = quantization.to_nf4(
                module.weight.detach(), NF4_BLOCK, math.gcd(NF4_SCALER_BLOCK, blocks)
            )
            module.weight = torch.nn.Parameter(weight, requires_grad=False)
    return {"quantization": kind, "backend": "torchao", "layers_kept_full_precision": kept}


def quantized_bytes(model: torch.nn.Module) -> int:
    """Bytes the base's weights hold, counting a quantized tensor by its packed storage."""
    total = 0
    for parameter in model.parameters():
        total += _tensor_bytes(parameter.data if isinstance(parameter, torch.nn.Parameter) else parameter)
    return total


def _tensor_bytes(tensor: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):  # a rank's shard (engine/sharding.py): the bytes this rank holds
        return _tensor_bytes(tensor.to_local())
    inner_names = getattr(tensor, "__tensor_flatten__", None)
    if inner_names is not None and type(tensor) is not torch.Tensor:
        names, _ = tensor.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()
