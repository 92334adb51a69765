"""External weights as files: `get_external_weights_urls` signs one URL per file of an `external_weights`
checkpoint (its PEFT adapter directory), which anyone holding the URL may GET until it expires, with no key, as
the SDK's `tinker checkpoint download` does. The signature (HMAC-SHA256 under a secret this backend process drew
at start) binds the job, checkpoint, file and expiry time, so a URL names one file for one hour and no other."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlencode

from cortex_nb.protocol.checkpoint_format import EXPORT_ADAPTER, export_manifest
from cortex_nb.protocol.errors import ApiError

from ...auth import Principal
from ...checkpoints import ExportPlan
from . import names
from .face import TinkerFace
from .routes import PREFIX

URL_LIFETIME_S = 3600
_SECRET = secrets.token_bytes(32)


def _signature(parts: tuple[str, ...], expires: int) -> str:
    message = "\0".join((*parts, str(expires))).encode()
    return hmac.new(_SECRET, message, hashlib.sha256).hexdigest()


def signed_query(*parts: str) -> str:
    """`expires=...&signature=...` for a URL naming `parts`, valid URL_LIFETIME_S from now."""
    expires = int(time.time()) + URL_LIFETIME_S
    return urlencode({"expires": expires, "signature": _signature(parts, expires)})


def check_signed(parts: tuple[str, ...], query: dict[str, list[bytes]]) -> None:
    """403 `download_link_invalid` unless the query signs exactly `parts` and has not expired."""
    try:
        expires = int(query["expires"][-1])
        given = query["signature"][-1].decode()
    except (KeyError, IndexError, ValueError, UnicodeDecodeError):
        raise ApiError("download_link_invalid", "this download URL lacks its expires or signature") from None
    if not hmac.compare_digest(given, _signature(parts, expires)):
        raise ApiError(
            "download_link_invalid", "this download URL's signature does not match; ask for new URLs"
        )
    if expires < time.time():
        raise ApiError("download_link_invalid", "this download URL has expired; ask for new URLs")


def signed_urls(
    face: TinkerFace, principal: Principal, base_url: str, training_run_id: str, kind: str, name: str
) -> dict[str, Any]:
    """`ExternalWeightsUrlsResponse` for a checkpoint this key may read (its own, or a published one)."""
    if kind != "external_weights":
        raise ApiError(
            "invalid_field",
            f"{kind}/{name}: only external_weights checkpoints (save_weights_external) are downloaded as files",
            {"field": "checkpoint_id"},
        )
    job_id, checkpoint_id = names.job_id_for(training_run_id), names.checkpoint_id(kind, name)
    row = face.service.checkpoints.find(principal, principal.owner, job_id, checkpoint_id, reading=True)
    expires = int(time.time()) + URL_LIFETIME_S
    urls = {}
    for file_name in export_manifest(row, EXPORT_ADAPTER)["files"]:
        query = signed_query(job_id, checkpoint_id, file_name)
        path = "/".join(quote(part, safe="") for part in (job_id, checkpoint_id, file_name))
        urls[file_name] = f"{base_url}{PREFIX}/external_weights/{path}?{query}"
    return {"urls": urls, "expires": datetime.fromtimestamp(expires, tz=timezone.utc).isoformat()}


@dataclass
class HeldFile:
    plan: ExportPlan
    sha256: str


def open_signed(
    face: TinkerFace, job_id: str, checkpoint_id: str, file_name: str, query: dict[str, list[bytes]]
) -> HeldFile:
    """The file a signed URL names, held against deletion (release with `end_export`); 403 for a bad or
    expired signature, 404 once the checkpoint is gone."""
    check_signed((job_id, checkpoint_id, file_name), query)
    row = face.service.store.get_checkpoint(job_id, checkpoint_id)
    if row is None:
        raise ApiError("checkpoint_not_found", f"checkpoint {checkpoint_id} of job {job_id} no longer exists")
    plan = face.service.checkpoints.begin_file_read(row, file_name)
    return HeldFile(plan, row["manifest"]["files"][file_name]["sha256"])


def range_start(header: str | None, size: int) -> int:
    """Where a `Range: bytes=N-` resume starts (0 without one)."""
    if not header:
        return 0
    unit, _, spec = header.partition("=")
    start, _, end = spec.partition("-")
    if unit.strip() != "bytes" or end.strip() or not start.strip().isdigit() or int(start) >= max(size, 1):
        raise ApiError(
            "invalid_request", f"Range: only 'bytes=N-' with N below {size} is served, got {header[:80]!r}"
        )
    return int(start)
