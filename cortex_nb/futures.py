"""Futures for data-plane requests: submit now, read the result when you need it.

Queue the next `forward_backward` before reading the last result and the worker never idles
waiting for the notebook (the backend runs each sub-job's requests in submission order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .api import Api, HasApi, RequestStatus, api_of
from .polling import poll_request
from .protocol.states import REQUEST_TERMINAL

T = TypeVar("T")
_UNSET = object()


class APIFuture(Generic[T]):
    """One queued request. `client` is what it was made with (a `Client`, or the `Api` itself)."""

    def __init__(
        self,
        client: Api | HasApi,
        job_id: str,
        request_id: str,
        op: str,
        transform: Callable[[dict[str, Any]], T] | None = None,
    ) -> None:
        self.client = client
        self.api = api_of(client)
        self.job_id = job_id
        self.request_id = request_id
        self.op = op
        self._transform = transform
        self._result: Any = _UNSET

    def result(self, timeout_s: float | None = None) -> T:
        """Block until the request finishes; raises `RequestFailed` if it failed."""
        if self._result is _UNSET:
            raw = poll_request(self.api, self.job_id, self.request_id, timeout_s=timeout_s)
            self._result = self._transform(raw) if self._transform else raw
        return self._result

    def done(self) -> bool:
        if self._result is not _UNSET:
            return True
        return self.api.get_request(self.job_id, self.request_id)["status"] in REQUEST_TERMINAL

    def status(self) -> RequestStatus:
        return self.api.get_request(self.job_id, self.request_id)

    def cancel(self) -> RequestStatus:
        return self.api.cancel_request(self.job_id, self.request_id)

    def __repr__(self) -> str:
        state = "done" if self._result is not _UNSET else "pending"
        return f"<APIFuture {self.op} {self.request_id} {state}>"


class ResolvedFuture(Generic[T]):
    """A result already in hand, behind the same `result()` as a queued request's (sampling a finished
    job answers through a short-lived job of its own, waited for before returning)."""

    def __init__(self, value: T, op: str) -> None:
        self._value = value
        self.op = op

    def result(self, timeout_s: float | None = None) -> T:
        return self._value

    def done(self) -> bool:
        return True

    def cancel(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"<ResolvedFuture {self.op} done>"
