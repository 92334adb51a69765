"""The checkpoint directory and its export archive: file names, the manifest, and how a file is checked.

A checkpoint directory is a standard PEFT adapter directory (adapter_config.json +
adapter_model.safetensors, loadable by `PeftModel.from_pretrained`). A resumable checkpoint adds
optimizer.safetensors (AdamW moments and step counts per adapter tensor, named
"<adapter tensor name>::<state key>"), trainer_state.json (the step counter and parameter order) and
rng_state.safetensors. Nothing is pickled. manifest.json, written last, lists every file with its
SHA-256 and size. An export is a tar whose first member is an export manifest (the files it carries),
whose SHA-256 travels in the `X-Cortex-Manifest-Sha256` header.

One definition, torch-free: the engine writes and reads checkpoints with it (engine/checkpoint.py),
the backend's checkpoint store checks and exports them (checkpoints.py), and the client checks an
export on arrival (checkpoint_files.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from typing import Any

FORMAT_VERSION = 1

RESUMABLE = "resumable"
WEIGHTS_ONLY = "weights-only"
CHECKPOINT_TYPES = (RESUMABLE, WEIGHTS_ONLY)

MANIFEST = "manifest.json"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
OPTIMIZER_STATE = "optimizer.safetensors"
TRAINER_STATE = "trainer_state.json"
RNG_STATE = "rng_state.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
RESUMABLE_FILES = (OPTIMIZER_STATE, TRAINER_STATE, RNG_STATE)
# The checkpoint the end of a training is saved as (a training run's last step, or "Free device" on
# a job with trained steps no checkpoint holds); `final-2`, ... when the name is taken.
FINAL_CHECKPOINT = "final"
# The resumable checkpoints a managed loop writes by itself: every few minutes without `save` in the spec
# (only the newest kept), and where it paused when the backend drained.
AUTO_CHECKPOINT_PREFIX = "auto-step-"
DRAINED_CHECKPOINT_PREFIX = "drained-step-"
# Optimizer tensors are stored as "<adapter tensor name>::<state key>", e.g. "...lora_A.weight::exp_avg".
STATE_SEPARATOR = "::"

# What an export carries: the PEFT adapter directory, or every file of the checkpoint.
EXPORT_ADAPTER = "adapter"
EXPORT_ALL = "all"
EXPORT_CONTENTS = (EXPORT_ADAPTER, EXPORT_ALL)
MANIFEST_SHA_HEADER = "X-Cortex-Manifest-Sha256"


def file_entry(data: bytes) -> dict[str, Any]:
    """A manifest's record of one file."""
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def matches(entry: dict[str, Any], sha256: str, size: int) -> bool:
    """Whether a file with this digest and size is the one its manifest entry records."""
    return entry["sha256"] == sha256 and int(entry["size"]) == size


def build_manifest(
    kind: str, step: int, adapter: dict[str, Any], state_hash: str, files: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The manifest of a checkpoint directory, written last."""
    return {
        "format_version": FORMAT_VERSION,
        "type": kind,
        "step": step,
        "created_at": time.time(),
        "adapter": adapter,
        "state_hash": state_hash,
        "files": files,
    }


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, indent=2, sort_keys=True).encode()


def export_names(files: Iterable[str], contents: str) -> list[str]:
    """The checkpoint files an export with these `contents` carries, in archive order."""
    return [name for name in sorted(files) if contents == EXPORT_ALL or name in ADAPTER_FILES]


def export_manifest(checkpoint: dict[str, Any], contents: str) -> dict[str, Any]:
    """The first member of an export: the checkpoint's identity and the entries of the files it carries.

    `checkpoint` is the store's row (`id`, `job_id`, `type`, `step`, `base_model`, `manifest`)."""
    manifest = checkpoint["manifest"]
    return {
        "checkpoint_id": checkpoint["id"],
        "job_id": checkpoint["job_id"],
        "type": checkpoint["type"],
        "step": checkpoint["step"],
        "contents": contents,
        "base_model": checkpoint["base_model"],
        "state_hash": manifest.get("state_hash"),
        "adapter": manifest.get("adapter"),
        "files": {name: manifest["files"][name] for name in export_names(manifest["files"], contents)},
    }


def safe_member_name(name: str) -> bool:
    """An export member name is a plain file name: no directories, no hidden or relative names."""
    return (
        bool(name)
        and "/" not in name
        and "\\" not in name
        and name not in (".", "..")
        and not name.startswith(".")
    )
