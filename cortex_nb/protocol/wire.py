"""The wire format for tensors: safetensors frames, split into SHA-256-checked chunks when large.

docs/wire.md is the contract. Client and backend both import this module, so there is one encoder
and one decoder. Tensors are numpy arrays here (the kernel side never imports torch); the backend
converts at its edge.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from safetensors.numpy import save as _st_save

from . import strict_json
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
# "<stream>/<n>" on a data-plane POST: numbered submissions run once each, in number order (docs/api.md).
SEQUENCE_HEADER = "X-Cortex-Sequence"
_SEQUENCE_VALUE = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.:-]{0,63})/([1-9][0-9]{0,17})")

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


def decode_frame(data: bytes | bytearray, copy: bool = True) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Parse a frame, refusing anything malformed with `invalid_frame` rather than a traceback.

    With `copy=False` the arrays view `data` in place (read-only for bytes): what the backend uses to
    check a large frame without holding it twice."""
    if len(data) < 8:
        raise ApiError(
            "invalid_frame",
            "the body is not a safetensors frame: it is shorter than its 8-byte header length",
        )
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > _HEADER_LIMIT or 8 + header_len > len(data):
        raise ApiError(
            "invalid_frame",
            f"the frame's header length ({header_len}) does not fit the body ({len(data)} bytes)",
        )
    try:
        header = strict_json.loads(bytes(data[8 : 8 + header_len]))
    except strict_json.StrictJsonError as exc:
        raise ApiError("invalid_frame", f"the frame's header {exc}") from None
    if not isinstance(header, dict):
        raise ApiError("invalid_frame", "the frame's header must be a JSON object")
    extra = header.get("__metadata__")
    if extra is not None and not (
        isinstance(extra, dict) and all(isinstance(v, str) for v in extra.values())
    ):
        raise ApiError("invalid_frame", "the frame's __metadata__ must map names to strings")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("dtype"), str)
            or info["dtype"] not in _ALLOWED_DTYPES
        ):
            dtype = info.get("dtype") if isinstance(info, dict) else None
            raise ApiError(
                "invalid_frame",
                f"tensor '{name}' has dtype {dtype!r}; frames carry {sorted(_ALLOWED_DTYPES)}",
            )
    tensors = _tensor_views(data, header, 8 + header_len)
    if copy:
        tensors = {name: array.copy() for name, array in tensors.items()}
    raw = (header.get("__metadata__") or {}).get(METADATA_KEY, "{}")
    try:
        metadata = strict_json.loads(raw)
    except strict_json.StrictJsonError as exc:
        raise ApiError("invalid_frame", f"the frame's cortex metadata {exc}") from None
    if not isinstance(metadata, dict):
        raise ApiError("invalid_frame", "the frame's cortex metadata must be a JSON object")
    return tensors, metadata


def parse_sequence(value: str) -> tuple[str, int]:
    """The (stream, number) of a `X-Cortex-Sequence` header, or `invalid_field`."""
    found = _SEQUENCE_VALUE.fullmatch(value.strip())
    if found is None:
        raise ApiError(
            "invalid_field",
            f"{SEQUENCE_HEADER}: must be '<stream>/<n>' with n from 1 up, got {value[:80]!r}",
            {"field": SEQUENCE_HEADER},
        )
    return found.group(1), int(found.group(2))


_NUMPY_DTYPES = {"I64": "<i8", "I32": "<i4", "F32": "<f4", "F16": "<f2", "F64": "<f8", "BOOL": "?"}


def _tensor_views(data: bytes | bytearray, header: dict[str, Any], start: int) -> dict[str, np.ndarray]:
    """Arrays that view the frame's bytes in place (no copy: a 256 MiB frame stays 256 MiB), after the
    checks the safetensors format makes: shapes of non-negative ints, byte ranges that match the shapes
    and tile the data section exactly, without gaps or overlaps."""
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (
            isinstance(shape, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape)
        ):
            raise ApiError("invalid_frame", f"tensor '{name}' has an invalid shape {str(shape)[:80]}")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) and 0 <= o < 1 << 62 for o in offsets)
        ):
            raise ApiError("invalid_frame", f"tensor '{name}' has invalid data_offsets {str(offsets)[:80]}")
        dtype = np.dtype(_NUMPY_DTYPES[info["dtype"]])
        count = int(np.prod(shape, dtype=object))
        if offsets[1] - offsets[0] != count * dtype.itemsize:
            raise ApiError(
                "invalid_frame", f"tensor '{name}': data_offsets {offsets} do not match shape {shape}"
            )
        entries.append((offsets[0], offsets[1], name, dtype, shape, count))
    entries.sort()
    position = 0
    for begin, end, name, *_ in entries:
        if begin != position:
            raise ApiError(
                "invalid_frame", f"tensor '{name}': its bytes overlap another tensor or leave a gap"
            )
        position = end
    if start + position != len(data):
        raise ApiError(
            "invalid_frame",
            f"the frame's tensors take {position} bytes but its data section is {len(data) - start}",
        )
    return {
        name: np.frombuffer(data, dtype, count, start + begin).reshape(shape)
        for begin, _, name, dtype, shape, count in entries
    }


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
