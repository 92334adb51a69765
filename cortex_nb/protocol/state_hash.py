"""The state hash: one SHA-256 that names a set of weights, whatever their dtype or device.

Weight sync compares the hash of what a sampler holds with what the trainer thinks it holds, and
checkpoint manifests record it. Both sides (numpy here, torch in the backend after `.float()`) feed
this one function, so the definition lives in one place. docs/api.md states it; a golden-digest test
pins it. Version 1:

    for name in sorted(names):                      # Python string order (code points)
        n = name.encode("utf-8")
        update(u64le(len(n)) + n)
        update(u64le(ndim) + u64le(dim) for each dim)
        update(values as little-endian float32, row-major)   # -0.0 -> +0.0, every NaN -> 0x7fc00000

then the hex digest. Values are converted to float32 first ("fp32-canonicalized").
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

STATE_HASH_VERSION = 1
_U64 = struct.Struct("<Q")
_CANONICAL_NAN = np.array([0x7FC00000], dtype="<u4").view("<f4")[0]
# Hash this many values at a time so a large tensor is never copied whole.
_BLOCK = 1 << 22


def canonical_fp32(array: Any) -> np.ndarray:
    """The float32, little-endian, row-major values with -0.0 and NaNs made canonical."""
    values = np.ascontiguousarray(np.asarray(array, dtype=np.float32)).astype("<f4", copy=True)
    values[values == 0] = 0.0
    values[np.isnan(values)] = _CANONICAL_NAN
    return values


def update_state_hash(digest: Any, name: str, array: Any) -> None:
    """Feed one named tensor into a running SHA-256 (callers feed names in sorted order)."""
    encoded = name.encode("utf-8")
    shape = np.shape(array)
    digest.update(_U64.pack(len(encoded)) + encoded)
    digest.update(_U64.pack(len(shape)) + b"".join(_U64.pack(int(dim)) for dim in shape))
    flat = np.asarray(array).reshape(-1)
    for start in range(0, flat.size, _BLOCK):
        digest.update(canonical_fp32(flat[start : start + _BLOCK]).tobytes())


def state_hash(tensors: Mapping[str, Any]) -> str:
    """SHA-256 hex digest of named tensors (numpy arrays or anything `np.asarray` takes)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        update_state_hash(digest, name, tensors[name])
    return digest.hexdigest()
