"""Write a tar archive piece by piece, so an export streams from disk without a temporary file.

Plain ustar members (regular files, mode 0644); any tar reader, including Python's `tarfile`, reads it.
"""

from __future__ import annotations

import tarfile

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)


def member_header(name: str, size: int, mtime: float) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = int(mtime)
    info.mode = 0o644
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def archive_size(sizes: list[int]) -> int:
    """The exact length of an archive of members of these sizes (for Content-Length)."""
    return sum(BLOCK + size + (-size % BLOCK) for size in sizes) + len(END_OF_ARCHIVE)
