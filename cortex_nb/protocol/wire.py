"""The wire format for tensors: safetensors frames, split into SHA-256-checked chunks when large.

docs/wire.md is the contract. Client and backend both import this module, so there is one encoder
and one decoder. Tensors are numpy arrays here (the kernel side never imports torch); the backend
converts at its edge.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from safetensors.numpy import load as _st_load
from safetensors.numpy import save as _st_save

from .errors import ApiError

FRAME_CONTENT_TYPE = "application/vnd.cortex.frame+safetensors"
METADATA_KEY = "cortex"

# A single HTTP body may be at most this big; larger frames travel as chunks.
MAX_BODY_BYTES = 16 * 1024 * 1024
CHUNK_BYTES = 8 * 1024 * 1024
# An assembled frame may be at most this big.
MAX_FRAME_BYTES = 1024 * 1024 * 1024
MAX_CHUNKS = MAX_FRAME_BYTES // CHUNK_BYTES

CHUNK_SHA_HEADER = "X-Cortex-Chunk-Sha256"
CHUNK_COUNT_HEADER = "X-Cortex-Chunk-Count"
UPLOAD_HEADER = "X-Cortex-Upload"
UPLOAD_SHA_HEADER = "X-Cortex-Upload-Sha256"

_ALLOWED_DTYPES = {"I64", "I32", "F32", "F16", "F64", "BOOL"}
_HEADER_LIMIT = 1024 * 1024


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_frame(tensors: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> bytes:
    """Serialize named arrays (numpy, or anything `np.asarray` takes) and JSON metadata."""
    arrays = {}
    for name, value in tensors.items():
        array = np.ascontiguousarray(np.asarray(value))
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        arrays[name] = array
    header = {METADATA_KEY: json.dumps(dict(metadata or {}), sort_keys=True)}
    return _st_save(arrays, metadata=header)


def decode_frame(data: bytes) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Parse a frame, refusing anything malformed with `invalid_frame` rather than a traceback."""
    if len(data) < 8:
        raise ApiError("invalid_frame", "the body is not a safetensors frame: it is shorter than its 8-byte header length")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > _HEADER_LIMIT or 8 + header_len > len(data):
        raise ApiError("invalid_frame", f"the frame's header length ({header_len}) does not fit the body ({len(data)} bytes)")
    try:
        header = json.loads(bytes(data[8 : 8 + header_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError("invalid_frame", f"the frame's header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ApiError("invalid_frame", "the frame's header must be a JSON object")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or info.get("dtype") not in _ALLOWED_DTYPES:
            dtype = info.get("dtype") if isinstance(info, dict) else None
            raise ApiError(
                "invalid_frame",
                f"tensor '{name}' has dtype {dtype!r}; frames carry {sorted(_ALLOWED_DTYPES)}",
            )
    try:
        tensors = _st_load(bytes(data))
    except Exception as exc:  # safetensors raises its own error types for corrupt bodies
        raise ApiError("invalid_frame", f"the frame could not be decoded: {exc}") from None
    raw = (header.get("__metadata__") or {}).get(METADATA_KEY, "{}")
    try:
        metadata = json.loads(raw)
    except json.JSONDecodeError:
        raise ApiError("invalid_frame", "the frame's cortex metadata is not JSON") from None
    if not isinstance(metadata, dict):
        raise ApiError("invalid_frame", "the frame's cortex metadata must be a JSON object")
    return tensors, metadata


@dataclass(frozen=True)
class Chunk:
    index: int
    data: bytes
    sha256: str


def split_chunks(data: bytes, chunk_bytes: int = CHUNK_BYTES) -> list[Chunk]:
    """Cut a frame into chunks, each carrying its own SHA-256."""
    return [
        Chunk(index, data[start : start + chunk_bytes], sha256_hex(data[start : start + chunk_bytes]))
        for index, start in enumerate(range(0, max(len(data), 1), chunk_bytes))
    ]


def verify_chunk(data: bytes, expected_sha256: str) -> None:
    actual = sha256_hex(data)
    if actual != expected_sha256.lower():
        raise ApiError(
            "chunk_mismatch",
            f"chunk SHA-256 is {actual} but the header says {expected_sha256}; resend the chunk",
        )


def assemble_chunks(chunks: Iterator[bytes] | list[bytes], expected_sha256: str) -> bytes:
    """Join chunks and check the whole frame's SHA-256, so a missing or reordered chunk is caught."""
    data = b"".join(chunks)
    actual = sha256_hex(data)
    if actual != expected_sha256.lower():
        raise ApiError(
            "chunk_mismatch",
            f"the assembled upload's SHA-256 is {actual}, expected {expected_sha256}; upload the chunks again",
        )
    return data
