"""A sub-job's model on its device: base weights, the LoRA adapter, the tokenizer, the weight version."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ..models import ModelInfo
from ..tokenizer import ByteTokenizer, FileTokenizer, Tokenizer
from .loading import load_base_model, pick_device, pick_dtype
from .lora import apply_lora
from .quantize import quantized_bytes
from .shared_base import forbid_merges, shares_base


class ModelState:
    def __init__(
        self,
        info: ModelInfo,
        spec: dict[str, Any],
        dtype: torch.dtype | None = None,
        base: torch.nn.Module | None = None,
    ) -> None:
        """`base`: the base model already built on this device (an adapter host's slots share one's
        weights); otherwise it is loaded here."""
        self.info = info
        self.spec = spec
        self.device = pick_device()
        # The device's precision unless told (scripts/gpu-check builds an fp32 reference on a GPU).
        self.dtype = dtype or pick_dtype(self.device)
        self.seed = int(spec.get("seed", 0))
        if base is None:
            base = load_base_model(info, self.device, self.dtype)
        self.model = apply_lora(base, spec.get("lora") or {}, self.seed)
        # An adapter host's base (shared_base.py): nothing may write to it, so its LoRA layers never merge.
        self.base_shared = shares_base(base)
        if self.base_shared:
            forbid_merges(self.model)
        self.model.to(self.device)
        # The process RNG drives LoRA dropout: seed it from the sub-job so a run is repeatable (and a
        # resumable checkpoint's saved RNG state continues exactly that sequence).
        torch.manual_seed(self.seed)
        self.tokenizer: Tokenizer | None = self._tokenizer()
        self.max_seq_len = int(spec.get("max_seq_len") or info.max_positions or 2048)
        # The trainer step whose weights this model holds (0 = the freshly initialised adapter).
        self.weight_version = 0

    def _tokenizer(self) -> Tokenizer | None:
        if self.info.kind == "builtin":
            return ByteTokenizer()
        if self.info.path is not None and (self.info.path / "tokenizer.json").exists():
            return FileTokenizer(self.info.path)
        return None

    @contextlib.contextmanager
    def inference(self) -> Iterator[None]:
        """Every module in eval mode and no autograd; each module's mode is restored afterwards."""
        modes = [(module, module.training) for module in self.model.modules()]
        self.model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            for module, training in modes:
                module.training = training

    def as_tensor(self, array: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
        tensor = torch.from_numpy(array.copy()) if not isinstance(array, torch.Tensor) else array
        return tensor.to(device=self.device, dtype=dtype) if dtype else tensor.to(self.device)

    def describe(self) -> dict[str, Any]:
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in self.model.parameters())
        return {
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "dtype": str(self.dtype).replace("torch.", ""),
            "trainable_parameters": trainable,
            "total_parameters": total,
            "max_seq_len": self.max_seq_len,
            "weight_version": self.weight_version,
            "quantization": self.info.quantization,
            # The base's weights as held (a quantized tensor by its packed bytes), apart from the adapter.
            "base_bytes": quantized_bytes(self.model) - adapter_bytes(self.model),
        }


def adapter_bytes(model: torch.nn.Module) -> int:
    """The adapter's bytes on this rank (a shard of it on a rank of a sub-job across devices)."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters() if p.requires_grad]
    return sum(p.numel() * p.element_size() for p in local)
