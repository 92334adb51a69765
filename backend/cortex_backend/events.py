"""The event feed: every job and request state change, in order, readable after a cursor.

Rows are written by database triggers (store.py) in the same transaction as the state change, so no
code path can change a status without an event, and reading never removes anything: a client that
lost a poll asks again from its cursor. Long-polls are woken by a small watcher that looks at the
feed's last sequence number while someone is waiting (one indexed read every WATCH_S).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from .auth import Principal
from .store import Store
from .waiters import Waiters

MAX_PAGE = 1000
MAX_WAIT_S = 60.0
WATCH_S = 0.05
KEY = "events"


def public_event(row: dict[str, Any]) -> dict[str, Any]:
    event = {
        "seq": row["seq"],
        "at": row["at"],
        "kind": row["kind"],
        "job_id": row["job_id"],
        "status": row["status"],
    }
    if row["kind"] == "request":
        event.update(request_id=row["request_id"], sub_job_id=row["sub_job_id"], op=row["op"])
    if row["failure_code"]:
        event["failure_code"] = row["failure_code"]
    return event


class EventFeed:
    def __init__(self, store: Store, retention: int) -> None:
        self.store = store
        self.retention = retention
        self.waiters = Waiters()
        self._waiting = 0
        self._watcher: asyncio.Task | None = None

    def page(self, principal: Principal, after: int, limit: int) -> dict[str, Any]:
        """Events after `after` that `principal` may see. The cursor moves past events of other owners
        too, so a quiet user's poll does not rescan everyone else's activity."""
        limit = max(1, min(limit, MAX_PAGE))
        last = self.store.last_event_seq()
        rows = self.store.events_after(after, None if principal.is_admin else principal.owner, limit)
        if len(rows) == limit:
            cursor = rows[-1]["seq"]
        else:
            cursor = max(after, last)
        return {"events": [public_event(row) for row in rows], "cursor": cursor}

    async def follow(self, principal: Principal, after: int, limit: int, wait_s: float) -> dict[str, Any]:
        """A page that waits up to `wait_s` for the first visible event when there is none yet."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(wait_s, MAX_WAIT_S)
        page = self.page(principal, after, limit)
        while not page["events"]:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            self._waiting += 1
            self._ensure_watcher()
            try:
                await self.waiters.wait(KEY, remaining)
            finally:
                self._waiting -= 1
            page = self.page(principal, page["cursor"], limit)
        return page

    def trim(self) -> int:
        return self.store.trim_events(self.retention)

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher

    def _ensure_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            # Read the baseline now, before any other callback can add an event, so none is missed.
            self._watcher = asyncio.ensure_future(self._watch(self.store.last_event_seq()))

    async def _watch(self, last: int) -> None:
        """Wake waiters when the feed grows; ends itself when nobody waits."""
        while self._waiting > 0:
            await asyncio.sleep(WATCH_S)
            current = self.store.last_event_seq()
            if current != last:
                last = current
                self.waiters.notify(KEY)
