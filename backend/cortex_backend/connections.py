"""The HTTP server's guard against slow and many connections.

Tornado's defaults let a connection that sends a partial body stay open for ever, accept connections
until the process runs out of file descriptors, and then, with the listening socket still readable,
log a traceback on every turn of the IO loop (a spinning core and hundreds of MB of log). Here: a
header and a body deadline (HTTPServer's own timeouts), a cap on open connections (answered with a
503 and closed, so a client knows), and an accept loop that backs off when descriptors run out.

Slow, silent connections (slowloris) must not take every connection the cap allows: a connection that
has not sent its request headers within `first_line_timeout_s` is closed, each client address may hold
at most `max_connections_per_address`, and when a cap is reached the oldest connection still silent
(of that address, or of any), once silent for `EVICT_SILENT_AFTER_S`, is closed to make room before a
new one is refused. A client that sends its request at once is never the oldest silent one, so it is served.
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import resource
import socket
from collections.abc import Callable, Iterable
from typing import Any

import tornado.httpserver
import tornado.iostream
from tornado import httputil
from tornado.http1connection import HTTP1ServerConnection
from tornado.ioloop import IOLoop

log = logging.getLogger("cortex_backend.http")

# Accepting stops this long when the process is out of descriptors (the backlog keeps what arrives).
ACCEPT_BACKOFF_S = 0.5
ACCEPT_BATCH = 128
# At a cap, a connection silent this long may be closed to make room for a new one.
EVICT_SILENT_AFTER_S = 0.5
OUT_OF_DESCRIPTORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

_BUSY_BODY = json.dumps(
    {
        "error": {
            "code": "too_many_connections",
            "message": (
                "the backend has as many connections open as it allows (--max-connections); retry shortly"
            ),
        }
    }
).encode()
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
    b"Connection: close\r\nRetry-After: 1\r\nContent-Length: "
    + str(len(_BUSY_BODY)).encode()
    + b"\r\n\r\n"
    + _BUSY_BODY
)


def raise_descriptor_limit() -> int:
    """Lift the soft open-files limit to the hard one; returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 16)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


class GuardedHTTPServer(tornado.httpserver.HTTPServer):
    """An HTTPServer with a connection cap and an accept loop that survives running out of descriptors."""

    max_connections = 1000
    max_connections_per_address = 500
    first_line_timeout_s = 10.0
    refused_connections = 0
    silent_closed = 0
    accept_pauses = 0

    def add_sockets(self, sockets: Iterable[socket.socket]) -> None:
        loop = IOLoop.current()
        for sock in sockets:
            self._sockets[sock.fileno()] = sock
            handler = self._accept_handler(sock)
            loop.add_handler(sock, handler, IOLoop.READ)
            self._handlers[sock.fileno()] = lambda sock=sock: loop.remove_handler(sock)

    def _accept_handler(self, sock: socket.socket):
        loop = IOLoop.current()

        def on_readable(fd: Any, events: int) -> None:
            for _ in range(ACCEPT_BATCH):
                try:
                    connection, address = sock.accept()
                except BlockingIOError:
                    return
                except ConnectionAbortedError:
                    continue
                except OSError as exc:
                    if exc.errno not in OUT_OF_DESCRIPTORS:
                        raise
                    # Stop watching the socket for a moment instead of failing on every loop turn.
                    self.accept_pauses += 1
                    if self.accept_pauses == 1 or self.accept_pauses % 100 == 0:
                        log.warning(
                            "out of file descriptors (%s); pausing new connections for %.1f s (%d pause(s) so far)",
                            exc.strerror,
                            ACCEPT_BACKOFF_S,
                            self.accept_pauses,
                        )
                    loop.remove_handler(sock)
                    loop.call_later(ACCEPT_BACKOFF_S, self._resume_accepting, sock, on_readable)
                    return
                self._handle_connection(connection, address)

        return on_readable

    def _resume_accepting(self, sock: socket.socket, handler) -> None:
        if sock.fileno() in self._sockets:
            IOLoop.current().add_handler(sock, handler, IOLoop.READ)

    def _refuse(self, stream: tornado.iostream.IOStream, why: str) -> None:
        self.refused_connections += 1
        if self.refused_connections == 1 or self.refused_connections % 1000 == 0:
            log.warning("%s; refused %d connection(s) so far", why, self.refused_connections)
        stream.write(BUSY_RESPONSE).add_done_callback(lambda _, s=stream: s.close())

    def _state(self) -> None:
        if not hasattr(self, "_silent"):
            # Connections that have sent no request headers yet, oldest first, and each one's address.
            self._silent: collections.OrderedDict[HTTP1ServerConnection, tuple[str, float]] = (
                collections.OrderedDict()
            )
            self._address_of: dict[HTTP1ServerConnection, str] = {}
            self._per_address: collections.Counter[str] = collections.Counter()

    def _close_oldest_silent(self, address: str | None = None) -> bool:
        """Close the oldest connection silent long enough (of `address`, or of any); False if none is."""
        old_enough = IOLoop.current().time() - EVICT_SILENT_AFTER_S
        for conn, (conn_address, since) in self._silent.items():
            if since > old_enough:
                return False  # the rest are younger still
            if address is None or conn_address == address:
                del self._silent[conn]
                self.silent_closed += 1
                # Answered as a refused connection would be, so a client that was only slow knows why.
                stream = conn.stream
                try:
                    stream.write(BUSY_RESPONSE).add_done_callback(lambda _, s=stream: s.close())
                except tornado.iostream.StreamClosedError:
                    pass
                return True
        return False

    def handle_stream(self, stream: tornado.iostream.IOStream, address: tuple) -> None:
        self._state()
        host = str(address[0]) if isinstance(address, tuple) and address else ""
        if self._per_address[host] >= self.max_connections_per_address and not self._close_oldest_silent(
            host
        ):
            self._refuse(
                stream, f"{host} holds {self.max_connections_per_address} connections (the per-address cap)"
            )
            return
        if len(self._connections) >= self.max_connections and not self._close_oldest_silent():
            self._refuse(stream, f"connection cap ({self.max_connections}) reached")
            return
        context = tornado.httpserver._HTTPRequestContext(
            stream, address, self.protocol, self.trusted_downstream
        )
        conn = HTTP1ServerConnection(stream, self.conn_params, context)
        self._connections.add(conn)
        self._address_of[conn] = host
        self._per_address[host] += 1
        self._silent[conn] = (host, IOLoop.current().time())
        IOLoop.current().call_later(self.first_line_timeout_s, self._close_if_silent, conn)
        conn.start_serving(self)

    def _close_if_silent(self, conn: HTTP1ServerConnection) -> None:
        if self._silent.pop(conn, None) is not None:
            self.silent_closed += 1
            conn.stream.close()

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> httputil.HTTPMessageDelegate:
        delegate = super().start_request(server_conn, request_conn)
        if server_conn in getattr(self, "_silent", {}):
            return _FirstHeaders(delegate, lambda: self._silent.pop(server_conn, None))
        return delegate

    def on_close(self, server_conn: object) -> None:
        super().on_close(server_conn)
        self._state()
        self._silent.pop(server_conn, None)
        host = self._address_of.pop(server_conn, None)
        if host is not None:
            self._per_address[host] -= 1
            if self._per_address[host] <= 0:
                del self._per_address[host]


class _FirstHeaders(httputil.HTTPMessageDelegate):
    """A connection's first request, noting when its headers have arrived (it is no longer silent)."""

    def __init__(self, inner: httputil.HTTPMessageDelegate, on_headers: Callable[[], Any]) -> None:
        self.inner = inner
        self.on_headers = on_headers

    def headers_received(self, start_line, headers):
        self.on_headers()
        return self.inner.headers_received(start_line, headers)

    def data_received(self, chunk: bytes):
        return self.inner.data_received(chunk)

    def finish(self) -> None:
        self.inner.finish()

    def on_connection_close(self) -> None:
        self.inner.on_connection_close()
