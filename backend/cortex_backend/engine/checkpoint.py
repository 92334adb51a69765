"""Write and read checkpoint directories in a worker, in the format of
`cortex_nb.protocol.checkpoint_format` (a PEFT adapter directory, plus optimizer, trainer and RNG state
for a resumable checkpoint, and manifest.json written last).

The worker writes into a temporary directory the service chose; the service renames it into place
and records it as valid (checkpoints.py). Loading checks every file against the manifest the service
recorded, so a file changed on disk is refused, never loaded.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from cortex_nb.protocol.checkpoint_format import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    MANIFEST,
    OPTIMIZER_STATE,
    RESUMABLE,
    RNG_STATE,
    STATE_SEPARATOR,
    TRAINER_STATE,
    build_manifest,
    encode_manifest,
    file_entry,
    matches,
)
from cortex_nb.protocol.state_hash import state_hash

from ..durable import fsync_directory
from ..faults import Faults
from .adapter import adapter_parameters, assign, signature
from .errors import OperationError
from .lora import ADAPTER_NAME, adapter_state
from .model_state import ModelState
from .sharding import full, is_writer, like

PAUSE_MID_SAVE_S = 120.0


def _write_file(directory: Path, name: str, data: bytes, files: dict[str, dict[str, Any]]) -> None:
    path = directory / name
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    files[name] = file_entry(data)


def _write_paused(directory: Path, name: str, data: bytes) -> None:
    """The `pause_mid_save` fault: leave half a file on disk and wait to be killed."""
    with open(directory / name, "wb") as handle:
        handle.write(data[: len(data) // 2])
        handle.flush()
        os.fsync(handle.fileno())
    print(f"[engine] save paused mid-write of {name} (fault injection); worker pid {os.getpid()}", flush=True)
    time.sleep(PAUSE_MID_SAVE_S)


def adapter_config_bytes(model: torch.nn.Module, base_model: str) -> bytes:
    """adapter_config.json as peft writes it, naming the registered model instead of a server path."""
    config = copy.deepcopy(model.peft_config[ADAPTER_NAME])
    config.base_model_name_or_path = base_model
    config.inference_mode = True
    output = config.to_dict()
    for key, value in output.items():
        if isinstance(value, set):
            output[key] = sorted(value)
    return json.dumps(output, indent=2, sort_keys=True).encode()


def _optimizer_tensors(
    trainer, names_by_parameter: dict[int, str]
) -> tuple[dict[str, torch.Tensor], list[str]]:
    tensors: dict[str, torch.Tensor] = {}
    order = [names_by_parameter[id(p)] for p in trainer.parameters]
    for parameter in trainer.parameters:
        for key, value in trainer.optimizer.state.get(parameter, {}).items():
            if not isinstance(value, torch.Tensor):
                raise OperationError(
                    "operation_failed", f"optimizer state {key!r} is not a tensor; it cannot be saved"
                )
            tensors[f"{names_by_parameter[id(parameter)]}{STATE_SEPARATOR}{key}"] = (
                full(value.detach()).cpu().contiguous()
            )
    return tensors, order


def _rng_tensors() -> dict[str, torch.Tensor]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for index, rng in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{index}"] = rng
    return tensors


def write_checkpoint(
    state: ModelState, trainer, directory: Path, kind: str, faults: Faults
) -> dict[str, Any]:
    """Write a complete checkpoint into `directory` (which must not exist yet); return its manifest.

    Across ranks, every rank gathers the whole adapter and optimizer state (collectives) and rank 0 alone
    writes: one adapter, not a shard per rank."""
    model = state.model
    adapter = {name: full(t.detach()).cpu().contiguous() for name, t in adapter_state(model).items()}
    if not is_writer():
        if kind == RESUMABLE:
            _optimizer_tensors(trainer, {id(p): name for name, p in adapter_parameters(model).items()})
        return {"step": trainer.step_count, "written_by_rank": 0}
    directory.mkdir(parents=False, exist_ok=False)
    files: dict[str, dict[str, Any]] = {}
    _write_file(directory, ADAPTER_CONFIG, adapter_config_bytes(model, state.info.name), files)
    weights = save_tensors(adapter, metadata={"format": "pt"})
    if faults.active("pause_mid_save"):
        _write_paused(directory, ADAPTER_WEIGHTS, weights)
    _write_file(directory, ADAPTER_WEIGHTS, weights, files)
    step = trainer.step_count
    if kind == RESUMABLE:
        names = {id(p): name for name, p in adapter_parameters(model).items()}
        optimizer_tensors, order = _optimizer_tensors(trainer, names)
        _write_file(directory, OPTIMIZER_STATE, save_tensors(optimizer_tensors), files)
        trainer_state = {
            "step": step,
            "optimizer": type(trainer.optimizer).__name__,
            "parameter_order": order,
            "pending_batches_not_saved": trainer.pending_batches,
        }
        _write_file(directory, TRAINER_STATE, json.dumps(trainer_state, indent=2).encode(), files)
        _write_file(directory, RNG_STATE, save_tensors(_rng_tensors()), files)
    manifest = build_manifest(
        kind,
        step,
        signature(model, state.info.name),
        state_hash({name: t.float().numpy() for name, t in adapter.items()}),
        files,
    )
    manifest_bytes = encode_manifest(manifest)
    with open(directory / MANIFEST, "wb") as handle:
        handle.write(manifest_bytes)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_directory(directory)
    return manifest


def read_verified(directory: Path, files: dict[str, dict[str, Any]], name: str) -> bytes:
    """A checkpoint file's bytes, after checking them against the recorded SHA-256 and size."""
    expected = files.get(name)
    if expected is None:
        raise OperationError("checkpoint_corrupted", f"the checkpoint's manifest lists no {name}")
    try:
        data = (directory / name).read_bytes()
    except OSError as exc:
        raise OperationError("checkpoint_corrupted", f"{name} cannot be read: {exc}") from None
    if not matches(expected, hashlib.sha256(data).hexdigest(), len(data)):
        raise OperationError(
            "checkpoint_corrupted",
            f"{name} does not match its SHA-256 in the manifest; the checkpoint was"
            " changed on disk and is not loaded",
        )
    return data


def _restore_optimizer(
    trainer, tensors: dict[str, torch.Tensor], order: list[str], parameters: dict[str, Any]
) -> None:
    """Load AdamW moments and step counts; hyperparameters stay those of the job loaded into."""
    by_name: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for key, value in tensors.items():
        name, _, state_key = key.rpartition(STATE_SEPARATOR)
        by_name[name][state_key] = value
    if set(order) != set(parameters) or set(by_name) - set(parameters):
        raise OperationError(
            "incompatible_adapter", "the checkpoint's optimizer state names other tensors than this adapter's"
        )
    index = {id(p): i for i, p in enumerate(trainer.parameters)}
    current = trainer.optimizer.state_dict()
    restored = {
        index[id(parameters[name])]: {
            key: value if key == "step" else like(parameters[name], value) for key, value in entries.items()
        }
        for name, entries in by_name.items()
    }
    trainer.optimizer.load_state_dict({"state": restored, "param_groups": current["param_groups"]})


def _restore_rng(tensors: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[key] for key in sorted(k for k in tensors if k.startswith("torch_cuda_"))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def load_checkpoint(
    state: ModelState, trainer, directory: Path, manifest: dict[str, Any], restore_optimizer: bool
) -> dict[str, Any]:
    """Load a checkpoint's adapter (and, into a trainer, its optimizer, step and RNG state)."""
    files = manifest["files"]
    adapter = load_tensors(read_verified(directory, files, ADAPTER_WEIGHTS))
    parameters = adapter_parameters(state.model)
    if set(adapter) != set(parameters) or any(
        tuple(adapter[n].shape) != tuple(parameters[n].shape) for n in adapter
    ):
        raise OperationError(
            "incompatible_adapter",
            "the checkpoint's adapter tensors do not fit this sub-job's adapter"
            " (another base model, rank or target modules)",
        )
    resumed = False
    if trainer is not None and restore_optimizer and manifest["type"] == RESUMABLE:
        optimizer_tensors = load_tensors(read_verified(directory, files, OPTIMIZER_STATE))
        trainer_state = json.loads(read_verified(directory, files, TRAINER_STATE))
        rng = load_tensors(read_verified(directory, files, RNG_STATE))
        assign(state.model, adapter)
        _restore_optimizer(trainer, optimizer_tensors, trainer_state["parameter_order"], parameters)
        _restore_rng(rng)
        resumed = True
    else:
        assign(state.model, adapter)
        if trainer is not None:
            trainer.optimizer.state = defaultdict(dict)  # weights only: fresh moments
    step = int(manifest["step"])
    if trainer is not None:
        if getattr(trainer, "offload", None) is not None:  # loaded beside the parameters: back to the host
            trainer.offload.to_host()
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.pending_batches = trainer.pending_tokens = 0
        trainer.step_count = step
    state.weight_version = step
    return {
        "step": step,
        "weight_version": step,
        "restored_optimizer": resumed,
        "state_hash": manifest.get("state_hash"),
    }
