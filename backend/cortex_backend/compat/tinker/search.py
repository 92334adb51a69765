"""`search_sessions`: the sessions this backend remembers (live ones, and the newest ended ones of each owner,
sessions.py), filtered as the SDK's SessionSearchRequest asks, newest first, a page at a time. There are no
session is in project `default` until `create_session` or `assign_session_project` names another, and
`project_ids` keeps the sessions of the projects it lists."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from cortex_nb.protocol.errors import ApiError

from ...auth import Principal
from .face import TinkerFace
from .sessions import Session, project_id

MAX_LIMIT = 200
FINISH_REASONS = ("success", "errored", "interrupted")


def _bad(field: str, why: str) -> ApiError:
    return ApiError("invalid_field", f"{field}: {why}", {"field": field})


def status(session: Session) -> dict[str, Any] | None:
    """Tinker's SessionStatus: active, client_finished with its reason, or None (ended without a word: its
    heartbeats stopped)."""
    if session.ended is None:
        return {"type": "active"}
    reason = session.ended.removeprefix("finished: ")
    if session.ended.startswith("finished: ") and reason in FINISH_REASONS:
        return {"type": "client_finished", "reason": {"type": reason}}
    return None


def _matches_status(found: dict[str, Any] | None, queries: list[Any]) -> bool:
    for query in queries:
        kind = query.get("type") if isinstance(query, dict) else None
        if kind not in ("active", "cancelled", "failed", "client_finished"):
            raise _bad("statuses", f"unknown status {kind!r}")
        if found is None or found["type"] != kind:
            continue
        reasons = query.get("reasons")
        if reasons is not None and not isinstance(reasons, list):
            raise _bad("statuses.reasons", "must be a list of finish reasons")
        if kind != "client_finished" or not reasons or found["reason"]["type"] in reasons:
            return True
    return False


def _owners(principal: Principal, owner: Any) -> set[str] | None:
    """The owners to search (None: every owner this key may see)."""
    kind = owner.get("type", "own") if isinstance(owner, dict) else "own"
    if kind == "own":
        return {principal.owner}
    if kind == "accessible":
        return None
    if kind == "user":
        urns = owner.get("owner_urns")
        if not isinstance(urns, list) or not 1 <= len(urns) <= 10:
            raise _bad("owner.owner_urns", "must list 1 to 10 owners")
        return {str(urn) for urn in urns}
    raise _bad("owner", f"must be own, accessible or user, got {kind!r}")


def search_sessions(face: TinkerFace, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
    projects = body.get("project_ids")
    if projects is not None and not (
        isinstance(projects, list) and all(isinstance(p, str) for p in projects)
    ):
        raise _bad("project_ids", "must be a list of project ids")
    wanted_projects = {project_id(p, "project_ids") for p in projects} if projects else None
    limit = body.get("limit", 50)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise _bad("limit", f"must be 1 to {MAX_LIMIT}")
    owners = _owners(principal, body.get("owner"))
    metadata = body.get("user_metadata") or {}
    if not isinstance(metadata, dict):
        raise _bad("user_metadata", "must be an object of key/value pairs")
    words = str(body.get("display_name") or "").lower().split()
    wanted_id = body.get("session_id")
    statuses = body.get("statuses")
    if statuses is not None and not (isinstance(statuses, list) and statuses):
        raise _bad("statuses", "must be a non-empty list of status queries")
    cursor = body.get("cursor")
    after = None
    if cursor is not None:
        try:
            after = (datetime.fromisoformat(cursor["last_created_at"]), str(cursor["last_session_id"]))
        except (KeyError, TypeError, ValueError):
            raise _bad("cursor", "pass a response's next_cursor back unchanged") from None

    found = []
    for session in face.sessions.visible(principal):
        if owners is not None and session.principal.owner not in owners:
            continue
        named = wanted_id is not None or words
        by_id = wanted_id is not None and session.id == wanted_id
        by_name = bool(words) and all(word in (session.display_name or "").lower() for word in words)
        if named and not (by_id or by_name):
            continue
        if wanted_projects is not None and session.project_id not in wanted_projects:
            continue
        if any(session.user_metadata.get(key) != value for key, value in metadata.items()):
            continue
        if statuses is not None and not _matches_status(status(session), statuses):
            continue
        if after is not None and _order(session) >= after:
            continue
        found.append(session)
    found.sort(key=_order, reverse=True)
    page = found[:limit]
    next_cursor = None
    if len(found) > limit:
        last = page[-1]
        next_cursor = {"last_created_at": _time(last.created_at), "last_session_id": last.id}
    return {"sessions": [_summary(face, session) for session in page], "next_cursor": next_cursor}


def _instant(at: float) -> datetime:
    return datetime.fromtimestamp(at, tz=timezone.utc)


def _time(at: float) -> str:
    return _instant(at).isoformat()


def _order(session: Session) -> tuple[datetime, str]:
    """A session's place in the listing, at the cursor's precision (whole microseconds): compared as the raw
    float, a page's last session whose time rounds up in its cursor would be listed again on the next page."""
    return _instant(session.created_at), session.id


def _summary(face: TinkerFace, session: Session) -> dict[str, Any]:
    store = face.service.store
    checkpoints = [row for job_id in session.models.values() for row in store.list_checkpoints(job_id)]
    return {
        "session_id": session.id,
        "created_at": _time(session.created_at),
        "owner": session.principal.owner,
        "project_id": session.project_id,
        "status": status(session),
        "checkpoints_count": len(checkpoints),
        "display_name": session.display_name,
        "user_metadata": {str(k): str(v) for k, v in session.user_metadata.items()} or None,
        "checkpoint_storage_bytes": sum(row["size_bytes"] for row in checkpoints),
    }
