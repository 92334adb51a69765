"""DSSST1, the Cortex Training SDK's binary frame, read and written with numpy (the IO loop never
imports torch).

A frame is one safetensors file. Its `__metadata__` holds `dss`, a JSON string
`{"v": "DSSST1", "tree": NODE}` describing a nested value, and optionally `op`, a JSON string of
operation metadata (response options, request/result chunk descriptors). A NODE is one of
  ["t", NAME] / ["t", NAME, {"scalar": true}]   a tensor stored under NAME (a scalar as shape [1])
  ["j", VALUE]                                 plain JSON
  ["d", [[KEY, NODE], ...]]                    a dict    ["l", [NODE, ...]]   a list
  ["u", [NODE, ...]]                           a tuple
A frame with no tensors carries a one-byte placeholder tensor, because safetensors needs one.

Chunks: a large frame travels as several DSSST1 frames, each `{"payload": uint8[...]}` with
`op.request_chunk` (or `op.result_chunk` for results) = {chunk_idx, total_chunks, frame_sha256,
frame_size_bytes, chunk_group_id?, operation?}.

Written from that description; every malformed input raises `ApiError("invalid_frame", ...)`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from safetensors.numpy import save as _st_save

from cortex_nb.protocol import strict_json
from cortex_nb.protocol.errors import ApiError

VERSION = "DSSST1"
PLACEHOLDER = "__dss_empty__"
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64

_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
}


def _invalid(message: str) -> ApiError:
    return ApiError("invalid_frame", f"not a valid DSSST1 frame: {message}")


def _header(data: bytes) -> dict[str, Any]:
    if len(data) < 8:
        raise _invalid("shorter than the 8-byte safetensors header length")
    (length,) = struct.unpack("<Q", data[:8])
    if length == 0 or length > MAX_HEADER_BYTES or 8 + length > len(data):
        raise _invalid(f"its header length {length} does not fit the {len(data)}-byte body")
    try:
        header = strict_json.loads(data[8 : 8 + length])
    except strict_json.StrictJsonError as exc:
        raise _invalid(f"its header {exc}") from None
    if not isinstance(header, dict):
        raise _invalid("its header is not a JSON object")
    return header


def _metadata_json(header: dict[str, Any], key: str) -> Any:
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise _invalid("__metadata__ is not an object")
    raw = metadata.get(key)
    if raw is None:
        return None
    try:
        return strict_json.loads(raw) if isinstance(raw, str) else None
    except strict_json.StrictJsonError as exc:
        raise _invalid(f"metadata {key!r} {exc}") from None


def read_op_metadata(data: bytes) -> dict[str, Any]:
    """The frame's operation metadata (`op`), without reading its tensors; {} when it has none."""
    op = _metadata_json(_header(data), "op")
    if op is not None and not isinstance(op, dict):
        raise _invalid("metadata 'op' is not an object")
    return op or {}


def _tensors(data: bytes, header: dict[str, Any]) -> dict[str, np.ndarray]:
    (length,) = struct.unpack("<Q", data[:8])
    body = memoryview(data)[8 + length :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or info.get("dtype") not in _DTYPES:
            raise _invalid(
                f"tensor {name!r} has an unknown dtype {info.get('dtype') if isinstance(info, dict) else None!r}"
            )
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if (
            not isinstance(shape, list)
            or not all(isinstance(d, int) and 0 <= d < 2**40 for d in shape)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
        ):
            raise _invalid(f"tensor {name!r} has a malformed shape or data_offsets")
        start, end = offsets
        dtype = _DTYPES[info["dtype"]]
        if (
            not 0 <= start <= end <= len(body)
            or end - start != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        ):
            raise _invalid(f"tensor {name!r}: its bytes do not match its shape and dtype")
        array = np.frombuffer(body[start:end], dtype=dtype).reshape(shape)
        if info["dtype"] == "BF16":  # no numpy bfloat16: widen to float32 exactly
            array = (array.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = array
    return tensors


def _decode(node: Any, tensors: dict[str, np.ndarray], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise _invalid(f"its structure nests deeper than {MAX_DEPTH}")
    if not isinstance(node, list) or not node or not isinstance(node[0], str):
        raise _invalid(f"structure node {str(node)[:60]!r} is malformed")
    tag = node[0]
    if tag == "j" and len(node) == 2:
        return node[1]
    if tag == "t" and len(node) in (2, 3) and isinstance(node[1], str):
        if node[1] not in tensors:
            raise _invalid(f"the structure names a tensor {node[1]!r} the frame does not hold")
        tensor = tensors[node[1]]
        if len(node) == 3 and isinstance(node[2], dict) and node[2].get("scalar"):
            return tensor.reshape(())
        return tensor
    if tag == "d" and len(node) == 2 and isinstance(node[1], list):
        out = {}
        for item in node[1]:
            if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str):
                raise _invalid("a dict entry is not [key, node]")
            out[item[0]] = _decode(item[1], tensors, depth + 1)
        return out
    if tag in ("l", "u") and len(node) == 2 and isinstance(node[1], list):
        items = [_decode(child, tensors, depth + 1) for child in node[1]]
        return tuple(items) if tag == "u" else items
    raise _invalid(f"unknown structure node {tag!r}")


def loads(data: bytes) -> tuple[Any, dict[str, Any]]:
    """(value, op metadata). Tensors come back as numpy arrays (bfloat16 widened to float32)."""
    header = _header(data)
    structure = _metadata_json(header, "dss")
    if not isinstance(structure, dict) or structure.get("v") != VERSION or "tree" not in structure:
        raise _invalid("it has no DSSST1 structure (metadata 'dss' with v = 'DSSST1')")
    op = _metadata_json(header, "op")
    tensors = _tensors(data, header)
    return _decode(structure["tree"], tensors, 0), op if isinstance(op, dict) else {}


def _encode(value: Any, tensors: dict[str, np.ndarray], path: str) -> list:
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)  # (ascontiguousarray would turn a scalar into shape [1])
        name = path or "__root__"
        if array.ndim == 0:
            tensors[name] = array.reshape(1)
            return ["t", name, {"scalar": True}]
        tensors[name] = np.ascontiguousarray(array)
        return ["t", name]
    if isinstance(value, dict):
        if not _holds_array(value):
            return ["j", value]
        return [
            "d",
            [[key, _encode(item, tensors, f"{path}.{key}" if path else key)] for key, item in value.items()],
        ]
    if isinstance(value, (list, tuple)):
        if isinstance(value, list) and not _holds_array(value):
            return ["j", value]
        nodes = [_encode(item, tensors, f"{path}.{i}" if path else str(i)) for i, item in enumerate(value)]
        return ["u" if isinstance(value, tuple) else "l", nodes]
    return ["j", value]


def _holds_array(value: Any) -> bool:
    if isinstance(value, (np.ndarray, np.generic)):
        return True
    if isinstance(value, dict):
        return any(_holds_array(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_array(item) for item in value)
    return False


def dumps(value: Any, op: dict[str, Any] | None = None) -> bytes:
    """One DSSST1 frame holding `value` (numpy arrays become tensors) and optional op metadata."""
    tensors: dict[str, np.ndarray] = {}
    tree = _encode(value, tensors, "")
    if not tensors:
        tensors[PLACEHOLDER] = np.zeros(1, dtype=np.uint8)
    metadata = {"dss": json.dumps({"v": VERSION, "tree": tree})}
    if op:
        metadata["op"] = json.dumps(op)
    return _st_save(tensors, metadata=metadata)


# chunks ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Chunk:
    """One request chunk: where it sits in its group and the bytes it carries."""

    group_id: str | None
    index: int
    total: int
    frame_sha256: str
    frame_size: int
    operation: str | None
    payload: bytes


def request_chunk(data: bytes) -> Chunk | None:
    """The chunk a body carries, or None when the body is a whole frame."""
    op = read_op_metadata(data)
    desc = op.get("request_chunk")
    if desc is None:
        return None
    if not isinstance(desc, dict):
        raise _invalid("op.request_chunk is not an object")
    try:
        index, total = int(desc["chunk_idx"]), int(desc["total_chunks"])
        frame_sha256, frame_size = str(desc["frame_sha256"]).lower(), int(desc["frame_size_bytes"])
    except (KeyError, TypeError, ValueError):
        raise _invalid(
            "op.request_chunk needs chunk_idx, total_chunks, frame_sha256, frame_size_bytes"
        ) from None
    if not 0 <= index < total or len(frame_sha256) != 64 or frame_size < 0:
        raise _invalid(f"chunk {index} of {total} (sha {frame_sha256[:12]}…) is out of range")
    value, _ = loads(data)
    payload = value.get("payload") if isinstance(value, dict) else None
    if not isinstance(payload, np.ndarray) or payload.dtype != np.uint8 or payload.ndim != 1:
        raise _invalid("a chunk's payload must be a 1-D uint8 tensor")
    group = desc.get("chunk_group_id")
    return Chunk(
        str(group) if group is not None else None,
        index,
        total,
        frame_sha256,
        frame_size,
        desc.get("operation"),
        payload.tobytes(),
    )


def result_chunks(frame: bytes, max_bytes: int) -> list[bytes]:
    """A result frame cut into result-chunk frames of at most about `max_bytes` payload each."""
    digest = hashlib.sha256(frame).hexdigest()
    starts = range(0, max(len(frame), 1), max_bytes)
    return [
        dumps(
            {"payload": np.frombuffer(frame[start : start + max_bytes], dtype=np.uint8)},
            {
                "result_chunk": {
                    "chunk_idx": i,
                    "total_chunks": len(starts),
                    "frame_sha256": digest,
                    "frame_size_bytes": len(frame),
                }
            },
        )
        for i, start in enumerate(starts)
    ]


def base64_result(frame: bytes) -> dict[str, str]:
    """How a whole result frame travels inside poll JSON."""
    return {
        "content_type": "application/octet-stream",
        "encoding": "base64",
        "wire_format": VERSION,
        "payload_b64": base64.b64encode(frame).decode("ascii"),
    }


def result_chunk_event(chunk: bytes) -> dict[str, str]:
    """A poll event carrying one result chunk, with the chunk's own SHA-256."""
    return {
        "type": "result_chunk",
        "payload_b64": base64.b64encode(chunk).decode("ascii"),
        "payload_sha256": hashlib.sha256(chunk).hexdigest(),
    }
