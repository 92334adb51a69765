"""The session search's cursor against sessions created within one microsecond of a page boundary: the cursor
carries whole microseconds, so a session whose creation time rounds up in it must not be listed again on the
next page (the live test in test_tinker_session_search.py met this now and then under load)."""

from __future__ import annotations

from types import SimpleNamespace

from cortex_backend.auth import Principal
from cortex_backend.compat.tinker.search import search_sessions
from cortex_backend.compat.tinker.sessions import Sessions
from cortex_backend.store import Store


def test_pages_never_repeat_a_session_whose_time_rounds_up_in_the_cursor(tmp_path):
    principal = Principal(token_id="t", owner="alice", scopes=frozenset({"jobs:read"}))
    sessions = Sessions(timeout_s=300, on_expired=lambda session: None)
    made = [sessions.create(principal, {"display_name": f"run {n}"}) for n in range(4)]
    # 0.7 µs past a whole microsecond: rounds up in the cursor's ISO time
    for n, session in enumerate(made):
        session.created_at = 1_800_000_000.0 + n * 1e-3 + 7e-7
    face = SimpleNamespace(sessions=sessions, service=SimpleNamespace(store=Store(tmp_path / "store.db")))

    seen: list[str] = []
    body: dict = {"display_name": "run", "limit": 1}
    for _ in range(2 * len(made)):  # bounded: a cursor that repeats a session would page for ever
        page = search_sessions(face, principal, body)
        seen += [summary["session_id"] for summary in page["sessions"]]
        if page["next_cursor"] is None:
            break
        body = {**body, "cursor": page["next_cursor"]}
    assert seen == [session.id for session in reversed(made)]
