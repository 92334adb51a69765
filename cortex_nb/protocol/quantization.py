"""The quantizations a base model may be held in (`backend serve --quantize NAME=KIND`; docs/models.md)."""

from __future__ import annotations

# nf4: 4-bit NormalFloat with double-quantized scalers (QLoRA); int8: 8-bit integer weights.
QUANTIZATIONS: tuple[str, ...] = ("nf4", "int8")
