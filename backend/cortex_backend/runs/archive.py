"""The uploaded source of a run: a plain tar of regular files plus a SHA-256 manifest.

The manifest is checked first (shape, limits, agreement with the spec's inputs); the archive must
then hold exactly the manifest's files, byte for byte. Extraction writes only regular files into a
fresh work dir (never links, devices or paths outside it), checking each hash again as it goes.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import tarfile
from pathlib import Path
from typing import Any

from cortex_nb.protocol.errors import ApiError, CortexError
from cortex_nb.protocol.schemas import run_spec
from cortex_nb.protocol.schemas.runs import ManifestEntry

READ_BLOCK = 1 << 20


def _manifest_error(message: str, path: str | None = None) -> ApiError:
    return ApiError("manifest_mismatch", message, {"path": path} if path else {})


def validate_manifest(manifest: list[ManifestEntry], spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The rules between the manifest's entries (whose shape CreateRun checked) and against the spec: clean
    relative paths, each once, within the limits; inputs exactly the spec's inputs."""
    entries, seen = [], set()
    source_bytes = source_files = 0
    for index, entry in enumerate(manifest):
        field = f"manifest[{index}]"
        try:
            path = run_spec.relative_path(entry.path, f"{field}.path")
        except CortexError as exc:
            raise ApiError("invalid_field", exc.message, exc.detail) from None
        size, digest, kind = entry.bytes, entry.sha256, entry.kind
        if path in seen:
            raise _manifest_error(f"{path} is listed twice in the manifest", path)
        seen.add(path)
        if kind == "source":
            source_bytes += size
            source_files += 1
        elif size > run_spec.MAX_INPUT_BYTES:
            raise ApiError(
                "spec_invalid",
                f"input {path} is {size} bytes; each input may be at most {run_spec.MAX_INPUT_BYTES}",
                {"field": "inputs"},
            )
        entries.append({"path": path, "bytes": size, "sha256": digest, "kind": kind})
    if source_files > run_spec.MAX_SOURCE_FILES:
        raise ApiError(
            "spec_invalid",
            f"source.include: {source_files} files; at most {run_spec.MAX_SOURCE_FILES}",
            {"field": "source.include"},
        )
    if source_bytes > run_spec.MAX_SOURCE_BYTES:
        raise ApiError(
            "spec_invalid",
            f"source.include: {source_bytes} bytes of source; at most"
            f" {run_spec.MAX_SOURCE_BYTES} (send data as inputs)",
            {"field": "source.include"},
        )
    declared = {entry["path"] for entry in spec["inputs"].values()}
    sent = {entry["path"] for entry in entries if entry["kind"] == "input"}
    if declared != sent:
        missing, extra = sorted(declared - sent), sorted(sent - declared)
        raise _manifest_error(
            f"the manifest's inputs do not match the spec's: missing {missing}, undeclared {extra}"
        )
    directories = {posixpath.dirname(path) for path in seen}
    parents = {"/".join(d.split("/")[:i]) for d in directories for i in range(1, d.count("/") + 2)}
    clash = sorted(seen & parents)
    if clash:
        raise _manifest_error(f"{clash[0]} is both a file and a folder in the manifest", clash[0])
    return entries


def _members(archive: Path, manifest: list[dict[str, Any]]):
    """Yield (entry, file object) for each archive member, refusing anything the manifest does not list."""
    expected = {entry["path"]: entry for entry in manifest}
    found: set[str] = set()
    with tarfile.open(archive, mode="r|") as tar:
        for member in tar:
            name = posixpath.normpath(member.name)
            entry = expected.get(name)
            if entry is None or name in found:
                raise _manifest_error(
                    f"the archive holds {member.name!r}, which the manifest does not list (once)", member.name
                )
            if not member.isfile():
                raise _manifest_error(
                    f"{member.name!r} is not a regular file; archives hold regular files only", member.name
                )
            if member.size != entry["bytes"]:
                raise _manifest_error(
                    f"{name} is {member.size} bytes in the archive but {entry['bytes']} in the manifest", name
                )
            found.add(name)
            yield entry, tar.extractfile(member)
    missing = sorted(set(expected) - found)
    if missing:
        raise _manifest_error(f"the archive lacks {missing[:5]} listed in the manifest", missing[0])


def _copy_checked(entry: dict[str, Any], source, sink=None) -> None:
    digest, size = hashlib.sha256(), 0
    while True:
        block = source.read(READ_BLOCK)
        if not block:
            break
        digest.update(block)
        size += len(block)
        if sink is not None:
            sink.write(block)
    if size != entry["bytes"] or digest.hexdigest() != entry["sha256"]:
        raise _manifest_error(f"{entry['path']} does not match its SHA-256 in the manifest", entry["path"])


def verify_archive(archive: Path, manifest: list[dict[str, Any]]) -> None:
    """The archive holds exactly the manifest's files with the manifest's sizes and hashes."""
    try:
        for entry, source in _members(archive, manifest):
            _copy_checked(entry, source)
    except tarfile.TarError as exc:
        raise _manifest_error(f"the source archive is not a readable tar: {exc}") from None


def extract_archive(archive: Path, manifest: list[dict[str, Any]], workdir: Path) -> None:
    """Write the manifest's files into a fresh `workdir`, checking each hash again."""
    for entry, source in _members(archive, manifest):
        target = workdir / entry["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as sink:
            _copy_checked(entry, source, sink)
