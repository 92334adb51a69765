"""Tinker futures: the ids the SDK polls with `retrieve_future`, each naming what it waits for and how its
result is shaped. Most are one of our requests (the future id is the request id); `create_model` waits for
its job to run."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from cortex_nb.protocol.errors import ApiError

from ...auth import Principal

# Futures remembered (oldest forgotten first); the SDK retrieves each within moments of submitting it.
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
    def __init__(self) -> None:
        self._futures: OrderedDict[str, Future] = OrderedDict()

    def add(self, future: Future) -> Future:
        self._futures[future.id] = future
        self._futures.move_to_end(future.id)
        while len(self._futures) > FUTURES_KEPT:
            self._futures.popitem(last=False)
        return future

    def get(self, principal: Principal, future_id: Any) -> Future:
        if not isinstance(future_id, str):
            raise ApiError(
                "invalid_field",
                f"request_id: must be the string a call returned, got {str(future_id)[:80]}",
                {"field": "request_id"},
            )
        future = self._futures.get(future_id)
        if future is None or not principal.can_see(future.owner):
            raise ApiError("request_not_found", f"no future {str(future_id)[:80]!r} is visible to this key")
        return future

    def known(self, future_id: str) -> Future | None:
        return self._futures.get(future_id)
