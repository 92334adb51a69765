"""What the Jupyter proxy sends to the backend and relays back, seen by a recording upstream server (a
plain Tornado app standing in for the backend), under a JupyterHub-style base_url."""

from __future__ import annotations

import asyncio
import json

import pytest
import tornado.web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from .test_server_extension import server_config


class RecordingUpstream:
    """A plain Tornado server standing in for the backend, to see exactly what the proxy sends."""

    def __init__(self) -> None:
        self.requests: list[tornado.httputil.HTTPServerRequest] = []
        self.first_chunk_seen = asyncio.Event()
        upstream = self

        class Handler(tornado.web.RequestHandler):
            async def get(self, *_):
                upstream.requests.append(self.request)
                if self.request.path.endswith("/logs"):
                    # Chunked: the second chunk is only sent once the caller has the first, which only
                    # happens if the proxy relays as it goes instead of buffering the whole answer.
                    self.set_header("Content-Type", "application/x-ndjson")
                    self.set_header("Set-Cookie", "upstream=secret")
                    self.write('{"seq": 1}\n')
                    await self.flush()
                    await asyncio.wait_for(upstream.first_chunk_seen.wait(), 30)
                    self.write('{"seq": 2}\n')
                    return
                self.set_header("X-Cortex-Version", "9.9.9")
                self.set_header("X-Internal", "not for the browser")
                self.write({"ok": True})

            post = get

        sockets = bind_sockets(0, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        self.server = HTTPServer(tornado.web.Application([(r"/.*", Handler)]))
        self.server.add_sockets(sockets)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def upstream():
    server = RecordingUpstream()
    yield server
    server.server.stop()


@pytest.fixture
def jp_base_url():
    """A JupyterHub-style prefix: every URL the extension serves must live under it."""
    return "/user/alice/"


@pytest.fixture
def jp_server_config(upstream, tmp_path):
    token = tmp_path / "token"
    token.write_text("upstream-test-token")
    return server_config(upstream.url, str(token))


@pytest.fixture
def proxy(jp_serverapp, http_server_client, jp_base_url, jp_auth_header):
    """(client, base_url, auth headers) for a Jupyter server whose backend is the recording upstream."""
    return http_server_client, jp_base_url, jp_auth_header


async def test_forwarded_headers_are_allowlisted(proxy, upstream):
    http_server_client, jp_base_url, auth = proxy
    response = await http_server_client.fetch(
        jp_base_url + "cortex/api/v1/jobs/job-1/cancel?sub_job=training-0",
        method="POST",
        body=b'{"a": 1}',
        headers={
            **auth,
            "Cookie": "_xsrf=abc; username-x=secret-cookie",
            "Content-Type": "application/json",
            "Idempotency-Key": "key-1",
            "X-Cortex-Upload": "up-1",
            "X-Other": "dropped",
        },
    )
    assert json.loads(response.body) == {"ok": True}
    seen = upstream.requests[-1]
    assert seen.path == "/v1/jobs/job-1/cancel" and seen.query == "sub_job=training-0"
    assert seen.body == b'{"a": 1}'
    assert seen.headers["Authorization"] == "Bearer upstream-test-token"
    assert "Cookie" not in seen.headers and "X-Other" not in seen.headers
    assert seen.headers["Idempotency-Key"] == "key-1" and seen.headers["X-Cortex-Upload"] == "up-1"
    assert response.headers["X-Cortex-Version"] == "9.9.9"
    assert "X-Internal" not in response.headers


async def test_responses_stream_through(proxy, upstream):
    http_server_client, jp_base_url, auth = proxy
    chunks: list[bytes] = []

    def on_chunk(chunk: bytes) -> None:
        chunks.append(chunk)
        if b'"seq": 1' in b"".join(chunks):
            upstream.first_chunk_seen.set()

    response = await http_server_client.fetch(
        jp_base_url + "cortex/api/v1/jobs/job-1/logs?wait=20",
        headers=auth,
        streaming_callback=on_chunk,
        request_timeout=60,
    )
    assert response.code == 200
    assert b"".join(chunks) == b'{"seq": 1}\n{"seq": 2}\n'
    assert not any("upstream" in cookie for cookie in response.headers.get_list("Set-Cookie"))


async def test_unreachable_backend_is_a_json_502(proxy, upstream):
    http_server_client, jp_base_url, auth = proxy
    upstream.server.stop()
    await upstream.server.close_all_connections()
    response = await http_server_client.fetch(
        jp_base_url + "cortex/api/v1/capacity", headers=auth, raise_error=False
    )
    assert response.code == 502
    assert json.loads(response.body)["error"]["code"] == "backend_unavailable"


async def test_urls_live_under_the_base_url(proxy, upstream):
    http_server_client, jp_base_url, auth = proxy
    assert jp_base_url == "/user/alice/"
    inside = await http_server_client.fetch(jp_base_url + "cortex/api/version", headers=auth)
    assert json.loads(inside.body) == {"ok": True}
    outside = await http_server_client.fetch("/cortex/api/version", headers=auth, raise_error=False)
    assert outside.code == 404
