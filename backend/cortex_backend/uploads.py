"""Chunked uploads: a large frame arrives as SHA-256-checked chunks, then is used by one request.

A chunk sent twice with the same content is accepted twice and stored once; a chunk group is
consumed by exactly one data-plane request (whose Idempotency-Key makes its retries replay).
Bounded: one owner's unused chunks may take `quota_bytes`, and an upload nobody used is deleted
`ttl_s` after its last chunk arrived (`sweep`).
"""

from __future__ import annotations

import hashlib
import mmap
import shutil
import threading
import time
from pathlib import Path

from cortex_nb.protocol import wire
from cortex_nb.protocol.errors import ApiError

from .auth import Principal
from .validation import ID_PATTERN


class UploadStore:
    def __init__(self, root: Path, quota_bytes: int | None = None, ttl_s: float = 3600.0) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.quota_bytes = quota_bytes
        self.ttl_s = ttl_s
        # Chunks run in threads (off the IO loop): one lock keeps the per-owner byte counts right.
        self._lock = threading.Lock()
        self.swept_bytes = 0

    def _owner_bytes(self, principal: Principal) -> int:
        folder = self.root / principal.owner.encode().hex()
        return (
            sum(path.stat().st_size for path in folder.glob("*/*") if path.is_file())
            if folder.exists()
            else 0
        )

    def _dir(self, principal: Principal, upload_id: str) -> Path:
        if not ID_PATTERN.match(upload_id):
            raise ApiError(
                "invalid_field", "upload_id: letters, digits, '_', '.', '-' only", {"field": "upload_id"}
            )
        owner = principal.owner.encode().hex()
        return self.root / owner / upload_id

    def put_chunk(
        self, principal: Principal, upload_id: str, index: int, count: int, sha256: str, data: bytes
    ) -> dict:
        if not 0 < count <= wire.MAX_CHUNKS or not 0 <= index < count:
            raise ApiError(
                "invalid_field",
                f"chunk {index} of {count}: index must be in [0, count), count at most {wire.MAX_CHUNKS}",
            )
        if len(data) > wire.CHUNK_BYTES:
            raise ApiError("body_too_large", f"a chunk is at most {wire.CHUNK_BYTES} bytes")
        wire.verify_chunk(data, sha256)
        folder = self._dir(principal, upload_id)
        if (folder / "consumed").exists():
            return {"upload_id": upload_id, "index": index, "status": "consumed"}
        path = folder / f"{index:06d}.{count:06d}"
        with self._lock:
            if path.exists():
                if wire.sha256_hex(path.read_bytes()) != sha256.lower():
                    raise ApiError(
                        "chunk_mismatch",
                        f"chunk {index} of upload {upload_id} was already stored with other content",
                    )
                return {"upload_id": upload_id, "index": index, "status": "stored"}
            if self.quota_bytes is not None:
                held = self._owner_bytes(principal)
                if held + len(data) > self.quota_bytes:
                    raise ApiError(
                        "quota_exceeded",
                        (
                            f"upload quota exceeded: this token's owner holds {held:,} bytes of chunks no request has used yet"
                            f" and may hold {self.quota_bytes:,}; use (or let expire, after {self.ttl_s:g} s) the uploads you"
                            " have, or ask the operator to raise --upload-quota-bytes"
                        ),
                        {"quota_bytes": self.quota_bytes, "used_bytes": held, "needed_bytes": len(data)},
                    )
            folder.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".partial")
            try:
                temporary.write_bytes(data)
                temporary.replace(path)
            except BaseException:
                temporary.unlink(missing_ok=True)  # a full disk keeps no half-written chunk
                raise
        return {"upload_id": upload_id, "index": index, "status": "stored"}

    def sweep(self, now: float | None = None) -> int:
        """Delete uploads whose last chunk arrived more than `ttl_s` ago (used or not); returns bytes freed."""
        now = time.time() if now is None else now
        freed = 0
        with self._lock:
            for folder in self.root.glob("*/*"):
                try:
                    files = list(folder.iterdir())
                    newest = max([folder.stat().st_mtime, *(path.stat().st_mtime for path in files)])
                except OSError:
                    continue
                if now - newest < self.ttl_s:
                    continue
                freed += sum(path.stat().st_size for path in files if path.is_file())
                shutil.rmtree(folder, ignore_errors=True)
        self.swept_bytes += freed
        return freed

    def _complete_parts(self, principal: Principal, upload_id: str) -> tuple[Path, list[Path]]:
        """The upload's chunk files in order, once every chunk is there and none was used before."""
        folder = self._dir(principal, upload_id)
        if (folder / "consumed").exists():
            raise ApiError("conflict", f"upload {upload_id} was already used by a request; upload it again")
        parts = sorted(folder.glob("*.*[0-9]")) if folder.exists() else []
        if not parts:
            raise ApiError("not_found", f"upload {upload_id} has no chunks; PUT them first")
        count = int(parts[0].name.split(".")[1])
        missing = sorted(set(range(count)) - {int(part.name.split(".")[0]) for part in parts})
        if missing:
            raise ApiError("chunk_mismatch", f"upload {upload_id} lacks chunk(s) {missing[:10]} of {count}")
        return folder, parts

    @staticmethod
    def _consume(folder: Path, parts: list[Path]) -> None:
        for part in parts:
            part.unlink()
        (folder / "consumed").write_text("")

    def take(self, principal: Principal, upload_id: str, sha256: str) -> mmap.mmap | bytes:
        """Assemble and consume the upload; its chunks are removed once used.

        The chunks are read straight into one anonymous memory map and hashed as they come: a frame of N
        bytes takes N bytes of memory (joining a list of chunks took twice that), and nothing holds the
        GIL for long (a bytearray of N bytes is zero-filled under the GIL first; a map is not)."""
        folder, parts = self._complete_parts(principal, upload_id)
        sizes = [part.stat().st_size for part in parts]
        if sum(sizes) > wire.MAX_FRAME_BYTES:
            raise ApiError(
                "body_too_large",
                f"upload {upload_id} is {sum(sizes)} bytes; a frame is at most {wire.MAX_FRAME_BYTES}",
            )
        if not sum(sizes):
            self._consume(folder, parts)
            if wire.sha256_hex(b"") != sha256.lower():
                raise ApiError("chunk_mismatch", f"the assembled upload's SHA-256 does not match {sha256}")
            return b""
        data = mmap.mmap(-1, sum(sizes))
        view = memoryview(data)
        digest, offset = hashlib.sha256(), 0
        for part, size in zip(parts, sizes, strict=True):
            with open(part, "rb") as handle:
                read = handle.readinto(view[offset : offset + size])
            if read != size:
                raise ApiError(
                    "chunk_mismatch", f"chunk {part.name} of upload {upload_id} changed while it was read"
                )
            digest.update(view[offset : offset + size])
            offset += size
        view.release()
        if digest.hexdigest() != sha256.lower():
            raise ApiError(
                "chunk_mismatch",
                f"the assembled upload's SHA-256 is {digest.hexdigest()}, expected {sha256};"
                " upload the chunks again",
            )
        self._consume(folder, parts)
        return data

    def take_to_file(self, principal: Principal, upload_id: str, sha256: str, dest: Path) -> int:
        """Like `take`, but streams the chunks into `dest` (large source-run archives); returns the size."""
        folder, parts = self._complete_parts(principal, upload_id)
        digest, size = hashlib.sha256(), 0
        with open(dest, "wb") as out:
            for part in parts:
                data = part.read_bytes()
                digest.update(data)
                size += len(data)
                out.write(data)
        if digest.hexdigest() != sha256.lower():
            dest.unlink(missing_ok=True)
            raise ApiError(
                "chunk_mismatch", f"upload {upload_id} does not match its SHA-256; upload it again"
            )
        self._consume(folder, parts)
        return size

    def clear(self) -> None:
        """Drop unfinished uploads (at start-up: nothing can resume them across a restart)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
