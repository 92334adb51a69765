"""The HTTP server's guard against slow and many connections.

Tornado's defaults let a connection that sends a partial body stay open for ever, accept connections
until the process runs out of file descriptors, and then, with the listening socket still readable,
log a traceback on every turn of the IO loop (a spinning core and hundreds of MB of log). Here: a
header and a body deadline (HTTPServer's own timeouts), a cap on open connections (answered with a
503 and closed, so a client knows), and an accept loop that backs off when descriptors run out.
"""

from __future__ import annotations

import errno
import json
import logging
import resource
import socket
from collections.abc import Iterable
from typing import Any

import tornado.httpserver
import tornado.iostream
from tornado.ioloop import IOLoop

log = logging.getLogger("cortex_backend.http")

# Accepting stops this long when the process is out of descriptors (the backlog keeps what arrives).
ACCEPT_BACKOFF_S = 0.5
ACCEPT_BATCH = 128
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
    refused_connections = 0
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

    def handle_stream(self, stream: tornado.iostream.IOStream, address: tuple) -> None:
        if len(self._connections) >= self.max_connections:
            self.refused_connections += 1
            if self.refused_connections == 1 or self.refused_connections % 1000 == 0:
                log.warning(
                    "connection cap (%d) reached; refused %d connection(s) so far",
                    self.max_connections,
                    self.refused_connections,
                )
            stream.write(BUSY_RESPONSE).add_done_callback(lambda _: stream.close())
            return
        super().handle_stream(stream, address)
