"""The Jupyter server's side of the connection to the backend: where it is, the token (read from a
file on the server, never sent to the browser or kernels), and which headers may cross.

Headers are allowlisted both ways: Jupyter's cookies, its Authorization header and anything else the
browser sends stay behind, and only the backend's content and cortex headers come back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse
from tornado.httputil import HTTPHeaders

from cortex_nb import tls
from cortex_nb.errors import ApiError
from cortex_nb.version import __version__

# Request headers the browser or kernel may pass on to the backend (lower case).
FORWARDED_REQUEST_HEADERS = frozenset({"content-type", "accept", "idempotency-key", "user-agent"})
# Response headers the backend may pass back (lower case).
FORWARDED_RESPONSE_HEADERS = frozenset({"content-type", "content-disposition", "retry-after", "idempotent-replay"})
CORTEX_HEADER_PREFIX = "x-cortex-"


def default_token_file() -> str:
    """The admin token a backend started with default settings writes (a laptop set-up)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "cortex-nb", "backend", "admin.token")


def request_headers_to_forward(incoming: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {name: value for name, value in incoming
            if name.lower() in FORWARDED_REQUEST_HEADERS or name.lower().startswith(CORTEX_HEADER_PREFIX)}


def response_headers_to_forward(incoming: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(name, value) for name, value in incoming
            if name.lower() in FORWARDED_RESPONSE_HEADERS or name.lower().startswith(CORTEX_HEADER_PREFIX)]


@dataclass
class TokenFile:
    """The backend token, re-read when the file changes (so rotating it needs no server restart)."""

    path: str
    _cached: tuple[float, int, str] | None = field(default=None, repr=False)

    def read(self) -> str:
        location = Path(self.path).expanduser()
        try:
            stat = location.stat()
            if self._cached is None or self._cached[:2] != (stat.st_mtime, stat.st_size):
                self._cached = (stat.st_mtime, stat.st_size, location.read_text().strip())
        except OSError as exc:
            raise ApiError(
                "proxy_not_configured",
                f"the Jupyter server cannot read the backend token file {str(location)!r} ({exc.strerror});"
                " set CortexServerApp.token_file or CORTEX_TOKEN_FILE to a file holding a backend token",
            ) from None
        if not self._cached[2]:
            raise ApiError("proxy_not_configured", f"the backend token file {str(location)!r} is empty")
        return self._cached[2]


class BackendConnection:
    """Sends requests to the backend on behalf of Jupyter-authenticated callers."""

    def __init__(self, url: str, token_file: str, *, connect_timeout_s: float, request_timeout_s: float,
                 max_clients: int = 64, verify: tls.Verify | None = None) -> None:
        self.url = url.rstrip("/")
        # An https backend's certificate: system CAs, a CA file or a pinned fingerprint (cortex_nb/tls.py).
        self.ssl_options = tls.ssl_context(verify) if self.url.startswith("https://") else None
        self.token_file = TokenFile(token_file)
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        # Our own client, so long-polls (logs, request status) never queue behind Jupyter's other fetches.
        self.http = AsyncHTTPClient(force_instance=True, max_clients=max_clients)

    def close(self) -> None:
        self.http.close()

    def build_request(
        self,
        method: str,
        path: str,
        query: str = "",
        *,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        authenticated: bool = True,
        header_callback: Callable[[str], None] | None = None,
        streaming_callback: Callable[[bytes], None] | None = None,
    ) -> HTTPRequest:
        outgoing = HTTPHeaders(headers or {})
        outgoing["User-Agent"] = f"cortex-server/{__version__} {outgoing.get('User-Agent', '')}".strip()
        if authenticated:
            outgoing["Authorization"] = f"Bearer {self.token_file.read()}"
        if body is None and method in ("POST", "PUT", "PATCH"):
            body = b""
        return HTTPRequest(
            self.url + path + (f"?{query}" if query else ""),
            method=method,
            headers=outgoing,
            body=body if method not in ("GET", "HEAD", "DELETE") else None,
            connect_timeout=self.connect_timeout_s,
            request_timeout=self.request_timeout_s,
            follow_redirects=False,
            decompress_response=False,
            ssl_options=self.ssl_options,
            allow_nonstandard_methods=True,
            header_callback=header_callback,
            streaming_callback=streaming_callback,
        )

    async def get_json(self, path: str, *, authenticated: bool = True) -> tuple[int, Any]:
        """A small JSON GET for the status page; (status, body) or raises on a connection failure."""
        try:
            response: HTTPResponse = await self.http.fetch(
                self.build_request("GET", path, authenticated=authenticated), raise_error=False
            )
        except (OSError, HTTPClientError) as exc:
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from None
        if response.code == 599:
            raise ConnectionError(str(response.error))
        try:
            return response.code, json.loads(response.body or b"null")
        except ValueError:
            return response.code, None
