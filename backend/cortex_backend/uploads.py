"""Chunked uploads: a large frame arrives as SHA-256-checked chunks, then is used by one request.

A chunk sent twice with the same content is accepted twice and stored once; a chunk group is
consumed by exactly one data-plane request (whose Idempotency-Key makes its retries replay).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from cortex_nb.protocol import wire
from cortex_nb.protocol.errors import ApiError

from .auth import Principal
from .validation import ID_PATTERN


class UploadStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def _dir(self, principal: Principal, upload_id: str) -> Path:
        if not ID_PATTERN.match(upload_id):
            raise ApiError("invalid_field", "upload_id: letters, digits, '_', '.', '-' only", {"field": "upload_id"})
        owner = principal.owner.encode().hex()
        return self.root / owner / upload_id

    def put_chunk(self, principal: Principal, upload_id: str, index: int, count: int, sha256: str, data: bytes) -> dict:
        if not 0 < count <= wire.MAX_CHUNKS or not 0 <= index < count:
            raise ApiError("invalid_field", f"chunk {index} of {count}: index must be in [0, count), count at most {wire.MAX_CHUNKS}")
        if len(data) > wire.CHUNK_BYTES:
            raise ApiError("body_too_large", f"a chunk is at most {wire.CHUNK_BYTES} bytes")
        wire.verify_chunk(data, sha256)
        folder = self._dir(principal, upload_id)
        if (folder / "consumed").exists():
            return {"upload_id": upload_id, "index": index, "status": "consumed"}
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{index:06d}.{count:06d}"
        if path.exists():
            if wire.sha256_hex(path.read_bytes()) != sha256.lower():
                raise ApiError("chunk_mismatch", f"chunk {index} of upload {upload_id} was already stored with other content")
            return {"upload_id": upload_id, "index": index, "status": "stored"}
        temporary = path.with_suffix(".partial")
        temporary.write_bytes(data)
        temporary.replace(path)
        return {"upload_id": upload_id, "index": index, "status": "stored"}

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

    def take(self, principal: Principal, upload_id: str, sha256: str) -> bytes:
        """Assemble and consume the upload; its chunks are removed once used."""
        folder, parts = self._complete_parts(principal, upload_id)
        data = wire.assemble_chunks([part.read_bytes() for part in parts], sha256)
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
            raise ApiError("chunk_mismatch", f"upload {upload_id} does not match its SHA-256; upload it again")
        self._consume(folder, parts)
        return size

    def clear(self) -> None:
        """Drop unfinished uploads (at start-up: nothing can resume them across a restart)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
