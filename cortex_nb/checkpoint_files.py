"""Unpack an exported checkpoint (a tar whose first member is manifest.json) and check every file.

The format is `cortex_nb.protocol.checkpoint_format`'s: the manifest's SHA-256 comes from a response
header; each file's SHA-256 and size come from the manifest. Nothing reaches the destination unless all of them match, and only plain files with plain
names are taken from the archive (no paths, links or devices), whatever the archive holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from . import errors
from .protocol.checkpoint_format import MANIFEST, matches, safe_member_name

if TYPE_CHECKING:
    from .api import Api


def _corrupt(message: str) -> errors.CortexError:
    return errors.CortexError(
        f"the exported checkpoint arrived damaged: {message}; export it again", code="checkpoint_corrupted"
    )


def extract_verified(archive: IO[bytes], dest: Path, manifest_sha256: str | None) -> dict[str, Any]:
    """Check `archive` against its manifest and unpack it into `dest` (which must not exist or be empty)."""
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"{dest} exists and is not an empty directory; choose a new destination")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        archive.seek(0)
        manifest: dict[str, Any] | None = None
        written: dict[str, tuple[str, int]] = {}
        with tarfile.open(fileobj=archive, mode="r|") as tar:
            for member in tar:
                if not member.isfile() or not safe_member_name(member.name):
                    raise _corrupt(f"it holds an unexpected member {member.name!r}")
                handle = tar.extractfile(member)
                digest, size = hashlib.sha256(), 0
                if manifest is None:
                    if member.name != MANIFEST:
                        raise _corrupt(f"its first member is {member.name!r}, not {MANIFEST}")
                    raw = handle.read()
                    if manifest_sha256 and hashlib.sha256(raw).hexdigest() != manifest_sha256:
                        raise _corrupt("the manifest does not match the SHA-256 the backend announced")
                    manifest = json.loads(raw)
                    (staging / MANIFEST).write_bytes(raw)
                    continue
                if member.name not in manifest["files"] or member.name in written:
                    raise _corrupt(f"{member.name} is not in its manifest (or appears twice)")
                with open(staging / member.name, "wb") as out:
                    for block in iter(lambda: handle.read(1 << 20), b""):  # noqa: B023
                        digest.update(block)
                        size += len(block)
                        out.write(block)
                written[member.name] = (digest.hexdigest(), size)
        if manifest is None:
            raise _corrupt("it is empty")
        for name, expected in manifest["files"].items():
            if name not in written:
                raise _corrupt(f"{name} is missing")
            if not matches(expected, *written[name]):
                raise _corrupt(f"{name} does not match its SHA-256 in the manifest")
        if dest.exists():
            dest.rmdir()
        os.replace(staging, dest)
        return manifest
    except tarfile.TarError as exc:
        raise _corrupt(f"it is not a readable tar ({exc})") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def download_checkpoint(
    api: Api, job_id: str, checkpoint_id: str, dest: str | os.PathLike, *, contents: str = "adapter"
) -> Path:
    """Export a checkpoint into `dest` (a new or empty directory), every file's SHA-256 checked on arrival;
    nothing is left in `dest` if one does not match."""
    with tempfile.TemporaryFile() as archive:
        manifest_sha256 = api.export_checkpoint(job_id, checkpoint_id, archive, contents=contents)
        extract_verified(archive, Path(dest), manifest_sha256)
    return Path(dest)
