"""Futures for data-plane requests: submit now, read the result when you need it.

Queue the next `forward_backward` before reading the last result and the worker never idles
waiting for the notebook (the backend runs each sub-job's requests in submission order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .protocol.states import REQUEST_TERMINAL

if TYPE_CHECKING:
    from .client import Client

T = TypeVar("T")
_UNSET = object()


class APIFuture(Generic[T]):
    def __init__(
        self,
        client: Client,
        job_id: str,
        request_id: str,
        op: str,
        transform: Callable[[dict[str, Any]], T] | None = None,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.request_id = request_id
        self.op = op
        self._transform = transform
        self._result: Any = _UNSET

    def result(self, timeout_s: float | None = None) -> T:
        """Block until the request finishes; raises `RequestFailed` if it failed."""
        if self._result is _UNSET:
            raw = self.client.poll_request(self.job_id, self.request_id, timeout_s=timeout_s)
            self._result = self._transform(raw) if self._transform else raw
        return self._result

    def done(self) -> bool:
        if self._result is not _UNSET:
            return True
        return self.client.get_request_status(self.job_id, self.request_id)["status"] in REQUEST_TERMINAL

    def status(self) -> dict[str, Any]:
        return self.client.get_request_status(self.job_id, self.request_id)

    def cancel(self) -> dict[str, Any]:
        return self.client.cancel_request(self.job_id, self.request_id)

    def __repr__(self) -> str:
        state = "done" if self._result is not _UNSET else "pending"
        return f"<APIFuture {self.op} {self.request_id} {state}>"
