"""Client behaviour that does not need a model: retries, idempotency keys, versions, profiles, polling."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cortex_nb import Client, PollPolicy, RetryPolicy, errors, profiles


class FlakyBackend:
    """A loopback HTTP server that answers 503 a few times before succeeding, recording what it saw."""

    def __init__(self, failures: int, api_version: str = "1.0") -> None:
        self.failures = failures
        self.seen: list[tuple[str, str, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                outer.seen.append((self.command, self.path, self.headers.get("Idempotency-Key")))
                if outer.failures > 0 and self.path != "/version":
                    outer.failures -= 1
                    self.send_response(503)
                    self.send_header("Retry-After", "0")
                    self.end_headers()
                    return
                body = json.dumps(
                    {
                        "service": "x",
                        "version": "9",
                        "api_version": api_version,
                        "request_id": "req-1",
                        "job_id": "j",
                        "sub_job_id": "s",
                        "status": "queued",
                    }
                ).encode()
                self.send_response(200 if self.command == "GET" else 202)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


FAST_RETRY = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.02)


def test_retries_reuse_one_idempotency_key():
    server = FlakyBackend(failures=2)
    try:
        client = Client(server.url, "t", retry=FAST_RETRY)
        assert client.step("j") == "req-1"
        posts = [seen for seen in server.seen if seen[0] == "POST"]
        assert len(posts) == 3
        assert len({key for _, _, key in posts}) == 1 and posts[0][2]
        assert client.transport.last_attempts == 3
    finally:
        server.close()


def test_retries_give_up_with_a_typed_error():
    server = FlakyBackend(failures=10)
    try:
        client = Client(server.url, "t", retry=FAST_RETRY)
        with pytest.raises(errors.BackendError) as info:
            client.step("j")
        assert info.value.status == 503
        assert len([s for s in server.seen if s[0] == "POST"]) == 4
    finally:
        server.close()


def test_unreachable_backend_raises_connection_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(errors.ConnectionError) as info:
        Client(f"http://127.0.0.1:{port}", "t", retry=FAST_RETRY)
    assert "could not reach" in str(info.value) and isinstance(info.value, ConnectionError)


def test_a_different_api_major_is_refused():
    server = FlakyBackend(failures=0, api_version="2.3")
    try:
        with pytest.raises(errors.VersionMismatchError) as caught:
            Client(server.url, "t")
        assert caught.value.code == "version_mismatch" and "2.3" in str(caught.value)
    finally:
        server.close()


def test_profiles_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CORTEX_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.delenv("CORTEX_URL", raising=False)
    assert profiles.from_env() is None and profiles.from_profile() is None
    path = profiles.save_profile("gpu", "http://gpu:8765", token_env="GPU_TOKEN")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(errors.CortexError, match="GPU_TOKEN"):
        profiles.from_profile()
    monkeypatch.setenv("GPU_TOKEN", "secret")
    endpoint = profiles.from_profile()
    assert (endpoint.url, endpoint.token) == ("http://gpu:8765", "secret")
    profiles.save_profile("other", "http://other:1", token="t2", make_default=True)
    assert profiles.from_profile().url == "http://other:1"
    assert profiles.from_profile("gpu").url == "http://gpu:8765"
    with pytest.raises(errors.CortexError, match="no profile 'missing'"):
        profiles.from_profile("missing")
    monkeypatch.setenv("CORTEX_URL", "http://env:2")
    monkeypatch.setenv("CORTEX_TOKEN", "t3")
    assert profiles.from_env().url == "http://env:2"


def test_from_profile_connects_to_a_real_backend(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("CORTEX_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.delenv("CORTEX_URL", raising=False)
    with pytest.raises(errors.CortexError, match="no backend configured"):
        Client.from_profile()
    profiles.save_profile("here", backend.url, token=backend.token)
    with Client.from_profile() as client:
        assert client.whoami()["owner"] == "admin"


def test_local_timeout_never_cancels_the_request(client):
    sampler = client.create_sampler("tiny")
    try:
        future = sampler.generate(["x"] * 4, max_tokens=300, temperature=1.0, ignore_eos=True, seed=3)
        client.poll = PollPolicy(timeout_s=0.2, long_poll_s=0.1)
        with pytest.raises(errors.TimeoutError):
            future.result(timeout_s=0.2)
        client.poll = PollPolicy()
        assert len(future.result().samples) == 4
    finally:
        sampler.cancel()


def test_plain_polling_with_backoff_also_works(client):
    client.poll = PollPolicy(interval_s=0.05, multiplier=2.0, max_interval_s=0.2, long_poll=False)
    intervals = client.poll.intervals()
    assert [round(next(intervals), 2) for _ in range(4)] == [0.05, 0.1, 0.2, 0.2]
    sampler = client.create_sampler("tiny")
    try:
        assert sampler.generate(["a"], max_tokens=3).result().samples[0]["finish_reason"] in (
            "length",
            "stop",
        )
    finally:
        sampler.cancel()


def test_importing_the_kernel_side_never_imports_torch():
    code = "import sys, cortex_nb, cortex_nb.client, cortex_nb.training; print('torch' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )
