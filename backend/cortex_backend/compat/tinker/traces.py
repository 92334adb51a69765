"""`export_session_trace`: a session's requests as a Chrome trace (JSON, which ui.perfetto.dev and
chrome://tracing open): one track per training run and sub-job, each request a queued slice (submitted to
started) and a running slice (started to finished), named by its operation. Built when downloaded, from the
store's own request records, so it is never stale; the SDK gets a signed URL to it (downloads.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ...auth import Principal
from . import names
from .downloads import check_signed, signed_query
from .face import TinkerFace
from .routes import PREFIX

# The most requests one training run contributes (the newest).
MAX_REQUESTS_PER_RUN = 20_000


def export_url(face: TinkerFace, principal: Principal, base_url: str, session_id: str) -> dict[str, Any]:
    """The SDK's poll answer: the trace is always ready (it is built when fetched)."""
    session = face.sessions.find(principal, session_id)
    query = signed_query("trace", session.id)
    return {
        "status": "ready",
        "url": f"{base_url}{PREFIX}/session_traces/{quote(session.id, safe='')}?{query}",
    }


def signed_trace(face: TinkerFace, session_id: str, query: dict[str, list[bytes]]) -> dict[str, Any]:
    check_signed(("trace", session_id), query)
    session = face.sessions.by_id(session_id)
    jobs = list(session.models.values()) if session is not None else []
    return chrome_trace(face, session_id, jobs)


def chrome_trace(face: TinkerFace, session_id: str, job_ids: list[str]) -> dict[str, Any]:
    store = face.service.store
    events: list[dict[str, Any]] = []
    for pid, job_id in enumerate(job_ids, start=1):
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "args": {"name": names.training_run_id_for(job_id)},
            }
        )
        threads: dict[str, int] = {}
        for request in reversed(store.list_requests(job_id, MAX_REQUESTS_PER_RUN)):
            tid = threads.setdefault(request["sub_job_id"], len(threads) + 1)
            created, started, finished = request["created_at"], request["started_at"], request["finished_at"]
            args = {"request_id": request["id"], "status": request["status"]}
            if started is not None:
                events.append(_slice(f"{request['op']} (queued)", pid, tid, created, started, args))
            if started is not None and finished is not None:
                events.append(_slice(request["op"], pid, tid, started, finished, args))
            elif started is None and finished is not None:  # refused or cancelled while queued
                events.append(
                    _slice(f"{request['op']} ({request['status']})", pid, tid, created, finished, args)
                )
        for sub_job_id, tid in threads.items():
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": sub_job_id}}
            )
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"session_id": session_id}}


def _slice(name: str, pid: int, tid: int, start: float, end: float, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "ph": "X",
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": round(start * 1e6),
        "dur": max(0, round((end - start) * 1e6)),
        "args": args,
    }
