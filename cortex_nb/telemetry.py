"""Client telemetry: the outcome of each essential `Client` operation, reported to the backend.

A record says which operation ran, whether it succeeded, how long it took, how many HTTP attempts
and retries it needed, and on failure the error type, HTTP status, error code and a short message
with credentials redacted (`redaction.py`). Failures are sent by default, best-effort, to
`POST /v1/telemetry`; successes only with CORTEX_ENABLE_SUCCESS_TELEMETRY=1;
CORTEX_DISABLE_TELEMETRY=1 turns it all off. The operator sees the aggregates in `/metrics`.

Telemetry never changes an outcome: recording is wrapped so that nothing it does can raise into the
caller, and sending happens on a background thread through a bounded queue (a full queue drops
records rather than wait), so an operation pays for building one small dict.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from .protocol.redaction import bounded
from .protocol.schemas.telemetry import (
    MAX_MESSAGE_CHARS,
    MAX_RECORDS_PER_POST,
)
from .protocol.versions import __version__

log = logging.getLogger("cortex_nb.telemetry")

ENV_DISABLE = "CORTEX_DISABLE_TELEMETRY"
ENV_SUCCESSES = "CORTEX_ENABLE_SUCCESS_TELEMETRY"

BATCH_WINDOW_S = 0.5
QUEUE_SIZE = 1000
SEND_TIMEOUT_S = 2.0

_active = threading.local()
T = TypeVar("T")


class Channel(Protocol):
    """Where a batch of records goes (`api.TelemetryChannel`: `POST /v1/telemetry`)."""

    def send(self, records: Sequence[Mapping[str, Any]]) -> None: ...

    def close(self) -> None: ...


# (url, headers, cookies, verify) -> a Channel; opened by the sender thread when it starts.
Connect = Callable[[str, dict[str, str], "dict[str, str] | None", Any], Channel]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class Telemetry:
    """Records operations for one `Client` and sends them from a background thread."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str] | None = None,
        cookies: dict[str, str] | None = None,
        *,
        enabled: bool | None = None,
        send_successes: bool | None = None,
        verify: Any = True,
        connect: Connect | None = None,
    ) -> None:
        """`connect` opens the channel records are sent on (the `Client` passes the API layer's); without
        one, records are kept in `recent` and counted as send failures."""
        self.url = url.rstrip("/")
        self._connect = connect
        self._verify = verify
        self.enabled = (not _env_flag(ENV_DISABLE)) if enabled is None else enabled
        self.send_successes = _env_flag(ENV_SUCCESSES) if send_successes is None else send_successes
        self.recent: deque[dict[str, Any]] = deque(maxlen=100)
        self.sent = 0
        self.dropped = 0
        self.send_failures = 0
        self._headers = dict(headers or {})
        self._cookies = cookies
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=QUEUE_SIZE)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._closed = False
        self._closing = threading.Event()

    # recording --------------------------------------------------------------------------------
    def record(
        self,
        operation: str,
        *,
        success: bool,
        duration_ms: float,
        attempts: int = 0,
        retries: int = 0,
        error: BaseException | None = None,
    ) -> dict[str, Any] | None:
        """Build a record and queue it for sending if the settings say so; returns it (None when off)."""
        if not self.enabled:
            return None
        record: dict[str, Any] = {
            "operation": operation,
            "success": success,
            "duration_ms": round(duration_ms, 3),
            "attempts": attempts,
            "retries": retries,
            "at": time.time(),
            "client_version": __version__,
        }
        if error is not None:
            record["error_type"] = type(error).__name__
            record["http_status"] = getattr(error, "status", None)
            record["error_code"] = getattr(error, "code", None)
            record["message"] = bounded(str(error), MAX_MESSAGE_CHARS)
        self.recent.append(record)
        if not success or self.send_successes:
            self._enqueue(record)
        return record

    def _enqueue(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                self._queue.put_nowait(record)
            except queue.Full:
                self.dropped += 1
                return
            self._in_flight += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._send_loop, name="cortex-telemetry", daemon=True)
                self._thread.start()

    # sending ----------------------------------------------------------------------------------
    def _send_loop(self) -> None:
        channel = None
        if self._connect is not None:
            try:
                channel = self._connect(self.url, self._headers, self._cookies, self._verify)
            except Exception as exc:  # best-effort, as every send is
                log.debug("telemetry channel not opened: %s", exc)
        try:
            while True:
                first = self._queue.get()
                if first is None:
                    return
                # Let a batch gather: the sender wakes once per window, not once per operation, so a
                # busy caller pays for a queue put and nothing else. close() cuts the window short.
                self._closing.wait(BATCH_WINDOW_S)
                batch, stop = [first], False
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        stop = True
                        break
                    batch.append(item)
                for start in range(0, len(batch), MAX_RECORDS_PER_POST):
                    self._deliver(channel, batch[start : start + MAX_RECORDS_PER_POST])
                if stop:
                    return
        finally:
            if channel is not None:
                channel.close()

    def _deliver(self, channel: Channel | None, batch: list[dict[str, Any]]) -> None:
        try:
            if channel is None:
                raise RuntimeError("no channel to send on")
            channel.send(batch)
            self.sent += len(batch)
        except Exception as exc:  # best-effort: a lost report is acceptable, a raised one is not
            self.send_failures += 1
            log.debug("telemetry not delivered: %s", exc)
        with self._lock:
            self._in_flight -= len(batch)
            self._idle.notify_all()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until queued records were delivered (or failed); True if nothing is left."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._in_flight > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def close(self) -> None:
        """Stop accepting records; the sender delivers what is queued and ends (never waited for)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._closing.set()
            if self._thread is None:
                return
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass  # the daemon thread ends with the process


def recorded(operation: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a `Client` method so its outcome is recorded. Nested recorded calls (poll_request
    inside a future's result, get_job inside wait_for_job) count once, as the outermost operation."""

    def wrap(method: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(method)
        def run(self: Any, *args: Any, **kwargs: Any) -> T:
            telemetry: Telemetry | None = getattr(self, "telemetry", None)
            if telemetry is None or not telemetry.enabled or getattr(_active, "depth", 0):
                return method(self, *args, **kwargs)
            _active.depth = 1
            started = time.perf_counter()
            before = _attempt_counts(self)
            try:
                result = method(self, *args, **kwargs)
            except BaseException as exc:
                _active.depth = 0
                _safe_record(telemetry, operation, self, started, before, exc)
                raise
            _active.depth = 0
            _safe_record(telemetry, operation, self, started, before, None)
            return result

        return run

    return wrap


def _attempt_counts(client: Any) -> tuple[int, int]:
    try:
        return client.transport.counters()
    except Exception:
        return (0, 0)


def _safe_record(
    telemetry: Telemetry,
    operation: str,
    client: Any,
    started: float,
    before: tuple[int, int],
    error: BaseException | None,
) -> None:
    try:
        calls, attempts = _attempt_counts(client)
        calls, attempts = calls - before[0], attempts - before[1]
        telemetry.record(
            operation,
            success=error is None,
            duration_ms=(time.perf_counter() - started) * 1000.0,
            attempts=attempts,
            retries=max(0, attempts - calls),
            error=error,
        )
    except Exception:  # telemetry must never change what the caller sees
        log.debug("telemetry record failed", exc_info=True)
