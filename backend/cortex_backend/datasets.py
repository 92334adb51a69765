"""Training datasets, uploaded once and named by the SHA-256 of their bytes.

`PUT /v1/datasets/{dataset_id}` stores a JSONL body whose hash is its id (a mismatch is refused), so a
client uploads a dataset only when `GET` says the backend lacks it, and a managed training loop names
its data by id. Rows are checked at upload with the same parser the kernel uses
(`cortex_nb.protocol.train_rows.examples_from_jsonl`). Datasets belong to their owner, like jobs: another
owner's id is a 404.

Layout: DATA_DIR/datasets/<owner as hex>/<dataset_id>.jsonl.
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.spec_errors import SpecError
from cortex_nb.protocol.schemas.training_loop import DATASET_ID
from cortex_nb.protocol.train_rows import examples_from_jsonl

from .auth import Principal
from .durable import fsync_directory
from .store import Store

PARTIAL_SUFFIX = ".partial"


def public_dataset(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "dataset_id": row["id"],
        "rows": row["rows"],
        "bytes": row["bytes"],
        "created_at": row["created_at"],
    }


class DatasetStore:
    def __init__(self, store: Store, root: Path, quota_bytes: int | None = None) -> None:
        self.store = store
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        # The most bytes of datasets one owner may keep (None: no cap); uploads run in threads, hence the lock.
        self.quota_bytes = quota_bytes
        self._lock = threading.Lock()

    def path(self, owner: str, dataset_id: str) -> Path:
        return self.root / owner.encode().hex() / f"{_checked_id(dataset_id)}.jsonl"

    def put(self, principal: Principal, dataset_id: str, body: bytes) -> dict[str, Any]:
        _checked_id(dataset_id)
        actual = hashlib.sha256(body).hexdigest()
        if actual != dataset_id:
            raise ApiError(
                "hash_mismatch",
                f"the body's SHA-256 is {actual}, not {dataset_id}; the dataset id is the"
                " SHA-256 hex of the JSONL bytes as sent",
                {"expected": dataset_id, "actual": actual},
            )
        with self._lock:
            return self._put_checked(principal, dataset_id, body)

    def _put_checked(self, principal: Principal, dataset_id: str, body: bytes) -> dict[str, Any]:
        existing = self.store.get_dataset(principal.owner, dataset_id)
        if existing is not None and self.path(principal.owner, dataset_id).is_file():
            return public_dataset(existing)
        if self.quota_bytes is not None:
            # Uploads being written (or left by a crash) count until they are recorded or removed.
            held = self.store.dataset_bytes(principal.owner) + self._partial_bytes(principal.owner)
            if held + len(body) > self.quota_bytes:
                raise ApiError(
                    "quota_exceeded",
                    (
                        f"dataset quota exceeded: this token's owner keeps {held:,} bytes of datasets and may keep"
                        f" {self.quota_bytes:,}; ask the operator to raise --dataset-quota-bytes"
                    ),
                    {"quota_bytes": self.quota_bytes, "used_bytes": held, "needed_bytes": len(body)},
                )
        try:
            rows = len(examples_from_jsonl(_lines(body), "the dataset"))
        except SpecError as exc:
            raise ApiError("invalid_dataset", exc.message.removeprefix("data: ")) from None
        path = self.path(principal.owner, dataset_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}")
        existed = path.is_file()
        try:
            with open(partial, "wb") as handle:
                handle.write(body)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, path)
            fsync_directory(path.parent)
            self.store.insert_dataset(principal.owner, dataset_id, rows, len(body))
        except BaseException:
            # A full disk (or a store that refused the row) keeps nothing: no partial file, and no file
            # without its row, which no quota would count.
            partial.unlink(missing_ok=True)
            if not existed and self.store.get_dataset(principal.owner, dataset_id) is None:
                path.unlink(missing_ok=True)
            raise
        return public_dataset(self.store.get_dataset(principal.owner, dataset_id))

    def _partial_bytes(self, owner: str) -> int:
        folder = self.root / owner.encode().hex()
        total = 0
        for partial in folder.glob(f".*{PARTIAL_SUFFIX}"):
            try:
                total += partial.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def remove_partial_files(self) -> int:
        """At start, no upload is being written: a `.partial` file is what a crash or a full disk left."""
        removed = 0
        for partial in self.root.glob(f"*/.*{PARTIAL_SUFFIX}"):
            try:
                partial.unlink()
                removed += 1
            except FileNotFoundError:
                pass
        return removed

    def get(self, principal: Principal, dataset_id: str, owner: str | None = None) -> dict[str, Any]:
        """The dataset's row if `owner` (default: the caller) has it and the caller may see it."""
        owner = owner or principal.owner
        row = self.store.get_dataset(owner, _checked_id(dataset_id)) if principal.can_see(owner) else None
        if row is None or not self.path(owner, dataset_id).is_file():
            raise ApiError(
                "dataset_not_found",
                f"no dataset {dataset_id} is visible to this token; upload it with"
                " PUT /v1/datasets/{dataset_id} (Client.train uploads for you)",
                {"dataset_id": dataset_id},
            )
        return public_dataset(row)

    def read(self, owner: str, dataset_id: str) -> bytes:
        return self.path(owner, dataset_id).read_bytes()


def _lines(body: bytes) -> Iterator[str]:
    """The body's lines, decoded one at a time: the whole text and a list of its lines would each take as much
    memory as the body again (a str of non-ASCII text up to four times)."""
    for number, line in enumerate(io.BytesIO(body), 1):
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ApiError(
                "invalid_dataset", f"the dataset is not UTF-8 text (line {number}): {exc}"
            ) from None


def _checked_id(dataset_id: str) -> str:
    if not isinstance(dataset_id, str) or not DATASET_ID.match(dataset_id):
        raise ApiError(
            "invalid_field",
            "dataset_id: must be the SHA-256 hex (64 lowercase hex digits) of the dataset",
            {"field": "dataset_id"},
        )
    return dataset_id
