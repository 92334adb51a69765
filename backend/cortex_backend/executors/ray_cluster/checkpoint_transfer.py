"""Checkpoints of sub-jobs on other hosts, kept where the backend's data dir is (the head).

The service chooses a checkpoint directory under its data dir (checkpoints.py) and hands it to the worker
as if it were local. On a host, the actor's staging swaps it for a temporary directory there: a save is
written there, its files travel back with the request's result (Ray moves large results through its
object store), and the head writes them into the chosen directory, checking each against the manifest's
SHA-256, before the service renames it into place. A load goes the other way: the head reads the
checkpoint's files, they travel with the request, and the worker reads them from a staging directory
(verifying every file against the manifest, as it does locally). A managed training loop (`train_loop`)
writes its checkpoints into a staging directory too; each `checkpoint` report carries that checkpoint's
files and names the directory on the head where the service expects it. No directory is shared between
hosts.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from ...durable import fsync_directory

STAGED_FILES = "staged_files"


class TransferError(Exception):
    """A checkpoint's files did not arrive whole."""


# head side ----------------------------------------------------------------------------------------
def read_checkpoint_files(directory: Path) -> dict[str, bytes]:
    """Every file of a checkpoint directory, to send to the host that loads it."""
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}


def write_checkpoint_files(directory: Path, files: dict[str, bytes], manifest: dict[str, Any]) -> None:
    """Write a save's files where the service expects them; refuse any that does not match the manifest."""
    for name in files:
        if "/" in name or name in ("", ".", ".."):
            raise TransferError(f"refused a file name from the host: {name!r}")
    listed = manifest.get("files", {})
    for name, entry in listed.items():
        data = files.get(name)
        if data is None:
            raise TransferError(f"{name} did not arrive from the host")
        if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise TransferError(f"{name} arrived changed (its SHA-256 or size differs from the manifest)")
    directory.mkdir(parents=False, exist_ok=False)
    for name, data in files.items():
        with open(directory / name, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    fsync_directory(directory)


# host side (inside the actor) ---------------------------------------------------------------------
class CheckpointStaging:
    """Swaps the head's checkpoint directories for staging directories on this host, and back."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="cortex-staging-"))
        self._saves: dict[str, Path] = {}
        self._loads: dict[str, Path] = {}
        # train_loop request id -> (its checkpoint dir here, the job's checkpoint dir on the head)
        self._loops: dict[str, tuple[Path, Path]] = {}
        self._lock = threading.Lock()

    def inbound(self, header: dict[str, Any], files: dict[str, bytes] | None) -> dict[str, Any]:
        """A request as the worker should see it: save, load and a loop's checkpoints pointed at staging
        directories here."""
        if header.get("type") != "request" or header.get("op") not in ("save", "load", "train_loop"):
            return header
        request_id = header["request_id"]
        holder = self.root / request_id
        holder.mkdir()
        if header["op"] == "train_loop":
            staged = holder / "checkpoints"
            with self._lock:
                self._loops[request_id] = (staged, Path(header["params"]["checkpoint_dir"]))
            return {**header, "params": {**header["params"], "checkpoint_dir": str(staged)}}
        staged = holder / "checkpoint"
        if header["op"] == "load":
            staged.mkdir()
            for name, data in (files or {}).items():
                (staged / Path(name).name).write_bytes(data)
        with self._lock:
            (self._saves if header["op"] == "save" else self._loads)[request_id] = staged
        return {**header, "params": {**header.get("params", {}), "directory": str(staged)}}

    def outbound(self, header: dict[str, Any]) -> dict[str, Any]:
        """A finished save, and a loop's checkpoint report, carry their files back; a finished request
        frees its staging directory."""
        if header.get("type") == "loop" and header.get("event") == "checkpoint":
            return self._loop_checkpoint(header)
        if header.get("type") != "finished":
            return header
        request_id = header["request_id"]
        with self._lock:
            saved = self._saves.pop(request_id, None)
            loaded = self._loads.pop(request_id, None)
            looped = self._loops.pop(request_id, None)
        staged = saved or loaded or (looped[0] if looped else None)
        if staged is None:
            return header
        try:
            # A rank other than rank 0 of a rank group writes nothing (rank 0 alone writes the checkpoint).
            if saved is not None and header.get("status") == "succeeded" and saved.is_dir():
                header = {**header, STAGED_FILES: read_checkpoint_files(saved)}
        finally:
            shutil.rmtree(staged.parent, ignore_errors=True)
        return header

    def _loop_checkpoint(self, header: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            loop = self._loops.get(header.get("request_id", ""))
        if loop is None or not Path(header["directory"]).is_dir():
            return header
        written = Path(header["directory"])
        try:
            files = read_checkpoint_files(written)
        finally:
            shutil.rmtree(written, ignore_errors=True)
        return {**header, "directory": str(loop[1] / written.name), STAGED_FILES: files}

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
