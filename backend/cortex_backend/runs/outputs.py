"""Collecting a finished run's declared outputs from its work dir, safely and with their hashes.

The run's code chose what lies in its work dir, so nothing there is trusted: every path component is
opened without following symlinks, the output must be a regular file with a single link, and its
size is checked before (and while) it is copied out. The backend records length and SHA-256; the
client checks both on download.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READ_BLOCK = 1 << 20


@dataclass
class CollectionFailure:
    code: str  # output_missing | output_too_large
    message: str
    output: str


class _Missing(Exception):
    pass


def _open_inside(workdir: Path, relative: str) -> int:
    """An fd for workdir/relative that never leaves the work dir through a symlink."""
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    parts = relative.split("/")
    current = os.open(workdir, flags_dir)
    try:
        for part in parts[:-1]:
            try:
                following = os.open(part, flags_dir, dir_fd=current)
            except OSError as exc:
                raise _Missing(f"{part}/ is not a folder ({os.strerror(exc.errno)})") from None
            os.close(current)
            current = following
        try:
            return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=current)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _Missing("it is a symlink; outputs must be regular files") from None
            raise _Missing(os.strerror(exc.errno)) from None
    finally:
        os.close(current)


def collect_outputs(
    workdir: Path, declared: dict[str, dict[str, Any]], dest: Path
) -> tuple[dict[str, dict[str, Any]], CollectionFailure | None]:
    """Copy each declared output to dest/<name>; returns what was collected and the first failure."""
    dest.mkdir(parents=True, exist_ok=True)
    collected: dict[str, dict[str, Any]] = {}
    failures: list[CollectionFailure] = []
    for name, entry in declared.items():
        path, limit = entry["path"], entry["max_bytes"]
        try:
            fd = _open_inside(workdir, path)
        except _Missing as exc:
            if entry["required"]:
                failures.append(
                    CollectionFailure(
                        "output_missing", f"output {name!r} ({path}) was not written: {exc}", name
                    )
                )
            continue
        with os.fdopen(fd, "rb") as source:
            info = os.fstat(source.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                failures.append(
                    CollectionFailure(
                        "output_missing",
                        f"output {name!r} ({path}) is not a regular file with one link",
                        name,
                    )
                )
                continue
            if info.st_size > limit:
                failures.append(
                    CollectionFailure(
                        "output_too_large",
                        f"output {name!r} ({path}) is {info.st_size} bytes; its max_bytes is {limit}",
                        name,
                    )
                )
                continue
            digest, size = hashlib.sha256(), 0
            target = dest / name
            with open(target, "wb") as sink:
                while True:
                    block = source.read(READ_BLOCK)
                    if not block:
                        break
                    size += len(block)
                    if size > limit:
                        break
                    digest.update(block)
                    sink.write(block)
            if size > limit:
                target.unlink(missing_ok=True)
                failures.append(
                    CollectionFailure(
                        "output_too_large", f"output {name!r} ({path}) grew past its max_bytes {limit}", name
                    )
                )
                continue
            collected[name] = {"path": path, "bytes": size, "sha256": digest.hexdigest()}
    return collected, (failures[0] if failures else None)
