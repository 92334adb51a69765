"""Tinker futures: the ids the SDK polls with `retrieve_future`, each naming what it waits for and how its
result is shaped. Most are one of our requests (the future id is the request id); `create_model` waits for
its job to run."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from cortex_nb.protocol.errors import ApiError

from ...auth import Principal

# Futures one owner's cache remembers (its oldest forgotten first); the SDK retrieves each within moments of
# submitting it. Per owner, so one owner's flood of calls never forgets another's pending results.
FUTURES_KEPT = 20_000


@dataclass
class Future:
    id: str
    owner: str
    kind: (
        str  # create_model, forward_backward, forward, optim_step, save_state, save_for_sampler, load, sample
    )
    job_id: str
    request_id: str | None = None
    # what the result needs besides the request's own result: datum lengths, a model id, a path, ...
    render: dict[str, Any] = field(default_factory=dict)


class Futures:
    def __init__(self, kept_per_owner: int = FUTURES_KEPT) -> None:
        self.kept_per_owner = kept_per_owner
        self._by_owner: dict[str, OrderedDict[str, Future]] = {}
        self._owner_of: dict[str, str] = {}  # future id -> owner

    def add(self, future: Future) -> Future:
        cache = self._by_owner.setdefault(future.owner, OrderedDict())
        cache[future.id] = future
        cache.move_to_end(future.id)
        self._owner_of[future.id] = future.owner
        while len(cache) > self.kept_per_owner:
            forgotten, _ = cache.popitem(last=False)
            del self._owner_of[forgotten]
        return future

    def get(self, principal: Principal, future_id: Any) -> Future:
        if not isinstance(future_id, str):
            raise ApiError(
                "invalid_field",
                f"request_id: must be the string a call returned, got {str(future_id)[:80]}",
                {"field": "request_id"},
            )
        future = self.known(future_id)
        if future is None or not principal.can_see(future.owner):
            raise ApiError("request_not_found", f"no future {str(future_id)[:80]!r} is visible to this key")
        return future

    def known(self, future_id: str) -> Future | None:
        owner = self._owner_of.get(future_id)
        return None if owner is None else self._by_owner[owner].get(future_id)

    def held(self, owner: str) -> int:
        return len(self._by_owner.get(owner, ()))
