"""`GET /v1/stats`: counts by state, queue wait and device-seconds over a window (stats.py computes)."""

from __future__ import annotations

import time

from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.stats import DEFAULT_STATS_WINDOW_S

from ..listings import owner_scope
from ..stats import compute_stats
from .base import BaseHandler


class StatsHandler(BaseHandler):
    def get(self) -> None:
        query = self.query_args()
        until = query.until if query.until is not None else time.time()
        since = query.since if query.since is not None else until - DEFAULT_STATS_WINDOW_S
        if until < since:
            raise ApiError("invalid_field", "until: must not be before since", {"field": "until"})
        owner = owner_scope(self.principal, query.owner)
        self.write_json(compute_stats(self.service.store, owner, since, until))
