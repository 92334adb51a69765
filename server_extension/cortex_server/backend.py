"""The Jupyter server's side of the connection to the backend: where it is (asked of a locator on every
call, see discovery.py), the token (read from a file on the server, never sent to the browser or
kernels), and which headers may cross.

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
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.versions import __version__

from .discovery import SOURCE_LOCAL, BackendLocator, BackendTarget

# Request headers the browser or kernel may pass on to the backend (lower case).
FORWARDED_REQUEST_HEADERS = frozenset({"content-type", "accept", "idempotency-key", "user-agent"})
# Response headers the backend may pass back (lower case).
FORWARDED_RESPONSE_HEADERS = frozenset(
    {"content-type", "content-disposition", "retry-after", "idempotent-replay"}
)
CORTEX_HEADER_PREFIX = "x-cortex-"


def default_token_file() -> str:
    """The user token (not admin) that a backend started with default settings writes, for a configured
    URL with no token file named: on a laptop running `cortex-nb backend serve`, it just works."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "cortex-nb", "backend", "user.token")


def request_headers_to_forward(incoming: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {
        name: value
        for name, value in incoming
        if name.lower() in FORWARDED_REQUEST_HEADERS or name.lower().startswith(CORTEX_HEADER_PREFIX)
    }


def response_headers_to_forward(incoming: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [
        (name, value)
        for name, value in incoming
        if name.lower() in FORWARDED_RESPONSE_HEADERS or name.lower().startswith(CORTEX_HEADER_PREFIX)
    ]


@dataclass
class TokenFile:
    """The backend token, re-read when the file changes (so rotating it needs no server restart)."""

    path: str
    # What to do about a missing or empty file, said to the user.
    hint: str = "set CortexServerApp.token_file or CORTEX_TOKEN_FILE to a file holding a backend token"
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
                f"the Jupyter server cannot read the backend token file {str(location)!r} ({exc.strerror}); {self.hint}",
            ) from None
        if not self._cached[2]:
            raise ApiError(
                "proxy_not_configured", f"the backend token file {str(location)!r} is empty; {self.hint}"
            )
        return self._cached[2]


class BackendConnection:
    """Sends requests to the backend on behalf of Jupyter-authenticated callers."""

    def __init__(
        self,
        locator: BackendLocator,
        *,
        connect_timeout_s: float,
        request_timeout_s: float,
        max_clients: int = 64,
        verify: tls.Verify | None = None,
    ) -> None:
        self.locator = locator
        self._token_file: TokenFile | None = None
        # An https backend's certificate: system CAs, a CA file or a pinned fingerprint (cortex_nb/tls.py).
        self._verify = verify
        self._ssl_context: Any = None
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        # Our own client, so long-polls (logs, request status) never queue behind Jupyter's other fetches.
        self.http = AsyncHTTPClient(force_instance=True, max_clients=max_clients)

    def close(self) -> None:
        self.http.close()

    @property
    def verify(self) -> tls.Verify | None:
        """How an https backend's certificate is checked (None: the system's CAs)."""
        return self._verify

    def target(self) -> BackendTarget:
        """Where calls go now: the configured backend, or the local one running now (or none)."""
        return self.locator.current()

    def ssl_options(self, target: BackendTarget) -> Any:
        """The TLS context for an https target (made once); None for plain http (the local backend)."""
        if not (target.url or "").startswith("https://"):
            return None
        if self._ssl_context is None:
            self._ssl_context = tls.ssl_context(self._verify)
        return self._ssl_context

    def token(self, target: BackendTarget) -> str:
        assert target.token_file is not None
        if self._token_file is None or self._token_file.path != target.token_file:
            hint = (
                "the local backend writes it when it starts; restart it (Start local backend in the Cortex sidebar)"
                if target.kind == SOURCE_LOCAL
                else TokenFile.hint
            )
            self._token_file = TokenFile(target.token_file, hint)
        return self._token_file.read()

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
        target: BackendTarget | None = None,
    ) -> HTTPRequest:
        target = target or self.target()
        if target.url is None:
            raise ApiError(
                "backend_unavailable",
                f"{target.description}: start it with Start local backend in the"
                " Cortex sidebar, or %cortex connect --local in a notebook",
                {"local_backend": "not_running"},
            )
        outgoing = HTTPHeaders(headers or {})
        outgoing["User-Agent"] = f"cortex-server/{__version__} {outgoing.get('User-Agent', '')}".strip()
        if authenticated:
            outgoing["Authorization"] = f"Bearer {self.token(target)}"
        if body is None and method in ("POST", "PUT", "PATCH"):
            body = b""
        return HTTPRequest(
            target.url + path + (f"?{query}" if query else ""),
            method=method,
            headers=outgoing,
            body=body if method not in ("GET", "HEAD", "DELETE") else None,
            connect_timeout=self.connect_timeout_s,
            request_timeout=self.request_timeout_s,
            follow_redirects=False,
            decompress_response=False,
            ssl_options=self.ssl_options(target),
            allow_nonstandard_methods=True,
            header_callback=header_callback,
            streaming_callback=streaming_callback,
        )

    async def get_json(
        self, target: BackendTarget, path: str, *, authenticated: bool = True
    ) -> tuple[int, Any]:
        """A small JSON GET for the status page; (status, body) or raises on a connection failure."""
        try:
            response: HTTPResponse = await self.http.fetch(
                self.build_request("GET", path, authenticated=authenticated, target=target), raise_error=False
            )
        except (OSError, HTTPClientError) as exc:
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from None
        if response.code == 599:
            raise ConnectionError(str(response.error))
        try:
            return response.code, json.loads(response.body or b"null")
        except ValueError:
            return response.code, None
