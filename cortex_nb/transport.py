"""HTTP to the backend: auth header, typed errors, and retries that are safe to make.

Every POST/PUT carries an Idempotency-Key that stays the same across its retries, so a retried
request runs once. 429, 5xx and connection failures are retried with capped exponential backoff
(honouring Retry-After); everything else raises at once.
"""

from __future__ import annotations

import contextlib
import random
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

import httpx

from . import errors, tls
from .protocol.versions import __version__


@dataclass
class RetryPolicy:
    """Retries for 429 / 5xx / connection errors."""

    max_attempts: int = 5
    initial_backoff_s: float = 0.25
    multiplier: float = 2.0
    max_backoff_s: float = 8.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.max_backoff_s * 4)
            except ValueError:
                pass
        base = min(self.initial_backoff_s * self.multiplier ** (attempt - 1), self.max_backoff_s)
        return base * (0.5 + random.random() / 2)


T = TypeVar("T")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class Transport:
    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        auth_scheme: str = "Bearer",
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        extra_headers: dict[str, str] | None = None,
        cookies: dict[str, str] | None = None,
        verify: tls.Verify | ssl.SSLContext | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.retry = retry or RetryPolicy()
        tls.refuse_pin_without_tls(self.url, verify)
        # How an https backend's certificate is checked (cortex_nb/tls.py); side channels reuse it.
        self.verify = tls.httpx_verify(verify)
        headers = {"User-Agent": f"cortex-nb/{__version__}", **(extra_headers or {})}
        if token:
            headers["Authorization"] = f"{auth_scheme} {token}"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout_s, cookies=cookies, verify=self.verify
        )
        # What a side channel to the same backend (telemetry) needs to authenticate like this transport.
        self.headers = dict(headers)
        self.cookies = dict(cookies or {})
        # How many attempts the last call took (for telemetry and tests).
        self.last_attempts = 0
        # Per-thread totals of calls and attempts: telemetry diffs them around an operation.
        self._counts = threading.local()

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        idempotency_key: str | None = None,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        """Send with retries; return the 2xx response or raise the typed error."""
        headers = dict(headers or {})
        if method in ("POST", "PUT", "DELETE"):
            headers.setdefault("Idempotency-Key", idempotency_key or uuid.uuid4().hex)
        params = {key: value for key, value in (params or {}).items() if value is not None}
        timeout = timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT

        def send() -> tuple[httpx.Response, httpx.Response]:
            response = self._http.request(
                method, path, json=json, content=content, params=params, headers=headers, timeout=timeout
            )
            return response, response

        return self._with_retries(f"{method} {path}", send)

    def _with_retries(self, what: str, send: Callable[[], tuple[httpx.Response, T]]) -> T:
        """Call `send` until it answers below 400 (its result is returned), retrying connection errors,
        429 and 5xx with backoff; any other error status raises the typed error at once."""
        attempt = 0
        self._count("calls")
        while True:
            attempt += 1
            self.last_attempts = attempt
            self._count("attempts")
            try:
                response, result = send()
            except httpx.TransportError as exc:
                if attempt >= self.retry.max_attempts:
                    raise errors.ConnectionError(
                        f"could not reach the backend at {self.url} for {what} after {attempt} attempt(s):"
                        f" {type(exc).__name__}: {exc}",
                        code="backend_unavailable",
                    ) from exc
                time.sleep(self.retry.delay(attempt))
                continue
            if response.status_code < 400:
                return result
            if response.status_code in RETRY_STATUSES and attempt < self.retry.max_attempts:
                time.sleep(self.retry.delay(attempt, response.headers.get("Retry-After")))
                continue
            raise errors.error_from_response(response.status_code, _json_or_text(response))

    def status_of(self, method: str, path: str) -> tuple[int, Any]:
        """(status, JSON body or text) of one attempt, whatever the status; `errors.ConnectionError` if
        nothing answered."""
        try:
            response = self._http.request(method, path)
        except httpx.TransportError as exc:
            raise errors.ConnectionError(
                f"could not reach {self.url}: {type(exc).__name__}: {exc}", code="backend_unavailable"
            ) from exc
        return response.status_code, _json_or_text(response)

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def download(
        self,
        path: str,
        sink: BinaryIO,
        *,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> httpx.Headers:
        """GET a (possibly large) body into `sink` without holding it in memory; returns the headers.
        Retried like `request`; the sink is truncated before each attempt."""
        params = {key: value for key, value in (params or {}).items() if value is not None}
        timeout = timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT

        def send() -> tuple[httpx.Response, httpx.Headers]:
            sink.seek(0)
            sink.truncate()
            with self._http.stream("GET", path, params=params, timeout=timeout) as response:
                if response.status_code < 400:
                    for block in response.iter_bytes():
                        sink.write(block)
                else:
                    response.read()
                return response, response.headers

        return self._with_retries(f"GET {path}", send)

    @contextlib.contextmanager
    def stream(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        json: Any = None,
    ) -> Iterator[httpx.Response]:
        """One streamed response (no retries: a streaming caller resumes from its own cursor).
        An error status raises the typed error; a dropped connection raises `errors.ConnectionError`."""
        params = {key: value for key, value in (params or {}).items() if value is not None}
        self._count("calls")
        self._count("attempts")
        timeout = (
            httpx.Timeout(self._http.timeout.connect, read=timeout_s)
            if timeout_s
            else httpx.USE_CLIENT_DEFAULT
        )
        try:
            with self._http.stream(method, path, params=params, timeout=timeout, json=json) as response:
                if response.status_code >= 400:
                    response.read()
                    raise errors.error_from_response(response.status_code, _json_or_text(response))
                yield response
        except httpx.TransportError as exc:
            raise errors.ConnectionError(
                f"the stream from {self.url} was interrupted: {type(exc).__name__}: {exc}",
                code="backend_unavailable",
            ) from exc

    def counters(self) -> tuple[int, int]:
        """(calls, attempts) made by this thread so far."""
        return getattr(self._counts, "calls", 0), getattr(self._counts, "attempts", 0)

    def _count(self, name: str) -> None:
        setattr(self._counts, name, getattr(self._counts, name, 0) + 1)


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text
