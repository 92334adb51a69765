"""Payloads of a weight sync: fp16 deltas (each tensor sparse or dense, whichever is smaller) or the
full float32 tensors, as a safetensors frame compressed with zstandard (with its frame checksum).

A delta is `fp16(new - base)`; the receiver adds it to its float32 weights. fp16 rounds, so the
receiver holds `base + fp16(new - base)`, not `new`: the sender computes exactly that result (the
same float32 additions), hashes it, and the receiver refuses the delta unless its own result has
that hash. Errors do not accumulate across syncs: each delta is taken against what the receiver
really holds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import torch
import zstandard
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

ZSTD_LEVEL = 3
META_KEY = "cortex_sync"
DENSE = "dense"
SPARSE = "sparse"
# Bytes per changed value in each encoding: a sparse entry is an int32 index plus an fp16 value.
DENSE_BYTES_PER_VALUE = 2
SPARSE_BYTES_PER_VALUE = 6


class PayloadError(Exception):
    """A payload that cannot be built or read; the sync falls back to a full transfer."""


@dataclass
class Payload:
    kind: str  # "delta" | "full"
    data: bytes  # the compressed frame, as sent
    raw_bytes: int  # the frame before compression
    encodings: dict[str, int] = field(default_factory=dict)  # how many tensors went dense / sparse

    @property
    def compression_ratio(self) -> float:
        return self.raw_bytes / len(self.data) if self.data else 1.0


def _compress(frame: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).compress(frame)


def _decompress(data: bytes) -> bytes:
    try:
        return zstandard.ZstdDecompressor().decompress(data)
    except zstandard.ZstdError as exc:
        raise PayloadError(f"the payload does not decompress: {exc}") from None


def delta_values(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fp16(new - base) per tensor, computed in float32; refuses deltas fp16 cannot hold."""
    deltas = {}
    for name in sorted(new):
        delta = (new[name].float() - base[name].float()).to(torch.float16)
        if not torch.isfinite(delta).all():
            raise PayloadError(f"{name}: a delta is outside fp16's range")
        deltas[name] = delta
    return deltas


def encode_delta(deltas: dict[str, torch.Tensor]) -> Payload:
    tensors: dict[str, torch.Tensor] = {}
    encodings: dict[str, str] = {}
    for name, delta in deltas.items():
        flat = delta.reshape(-1)
        changed = torch.nonzero(flat, as_tuple=False).reshape(-1)
        if changed.numel() * SPARSE_BYTES_PER_VALUE < flat.numel() * DENSE_BYTES_PER_VALUE:
            encodings[name] = SPARSE
            tensors[f"{name}#indices"] = changed.to(torch.int32).contiguous()
            tensors[f"{name}#values"] = flat[changed].contiguous()
        else:
            encodings[name] = DENSE
            tensors[f"{name}#values"] = delta.contiguous()
    shapes = {name: list(delta.shape) for name, delta in deltas.items()}
    frame = save_tensors(
        tensors, metadata={META_KEY: json.dumps({"kind": "delta", "encodings": encodings, "shapes": shapes})}
    )
    counts = {
        DENSE: sum(1 for e in encodings.values() if e == DENSE),
        SPARSE: sum(1 for e in encodings.values() if e == SPARSE),
    }
    return Payload("delta", _compress(frame), len(frame), counts)


def encode_full(tensors: dict[str, torch.Tensor]) -> Payload:
    frame = save_tensors(
        {name: t.to(torch.float32).contiguous() for name, t in tensors.items()},
        metadata={META_KEY: json.dumps({"kind": "full"})},
    )
    return Payload("full", _compress(frame), len(frame), {DENSE: len(tensors), SPARSE: 0})


def _read_frame(data: bytes) -> tuple[dict[str, torch.Tensor], dict]:
    frame = _decompress(data)
    try:
        tensors = load_tensors(frame)
        header_len = int.from_bytes(frame[:8], "little")
        metadata = json.loads(json.loads(frame[8 : 8 + header_len])["__metadata__"][META_KEY])
    except Exception as exc:  # safetensors and json raise their own types for a damaged frame
        raise PayloadError(f"the payload frame is damaged: {exc}") from None
    return tensors, metadata


def decode_delta(data: bytes) -> dict[str, torch.Tensor]:
    """The dense fp16 delta of every tensor."""
    tensors, metadata = _read_frame(data)
    if metadata.get("kind") != "delta":
        raise PayloadError("the payload is not a delta")
    deltas = {}
    try:
        for name, encoding in metadata["encodings"].items():
            shape = metadata["shapes"][name]
            values = tensors[f"{name}#values"]
            if encoding == DENSE:
                deltas[name] = values.reshape(shape)
            else:
                dense = torch.zeros(math.prod(shape), dtype=torch.float16)
                dense[tensors[f"{name}#indices"].long()] = values
                deltas[name] = dense.reshape(shape)
    except (KeyError, IndexError, RuntimeError) as exc:
        raise PayloadError(f"the delta frame is inconsistent: {exc}") from None
    return deltas


def decode_full(data: bytes) -> dict[str, torch.Tensor]:
    tensors, metadata = _read_frame(data)
    if metadata.get("kind") != "full":
        raise PayloadError("the payload is not a full transfer")
    return tensors


def apply_delta(base: dict[str, torch.Tensor], deltas: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """base + delta in float32, per tensor (names must match)."""
    if set(base) != set(deltas):
        raise PayloadError("the delta names other tensors than the base")
    result = {}
    for name, value in base.items():
        delta = deltas[name]
        if tuple(delta.shape) != tuple(value.shape):
            raise PayloadError(f"{name}: delta shape {list(delta.shape)} does not fit {list(value.shape)}")
        result[name] = value.float() + delta.to(device=value.device, dtype=torch.float32)
    return result
