"""The Jupyter proxy in front of a backend that serves HTTPS: it pins the backend's certificate,
forwards as usual, and refuses (saying why) a certificate that does not match the pin."""

from __future__ import annotations

import json

import pytest

from .test_server_extension import server_config

WRONG_PIN = "sha256:" + "cd" * 32


@pytest.fixture(params=["pinned", "wrong-pin"])
def pin(request, tls_backend):
    return tls_backend.fingerprint if request.param == "pinned" else WRONG_PIN


@pytest.fixture
def jp_server_config(tls_backend, pin, tmp_path):
    token_file = tmp_path / "backend.token"
    token_file.write_text(tls_backend.token + "\n")
    token_file.chmod(0o600)
    config = server_config(tls_backend.url, str(token_file))
    config["CortexServerApp"]["backend_verify"] = pin
    return config


async def test_proxy_works_against_an_https_backend(jp_fetch, tls_backend, pin):
    status = json.loads((await jp_fetch("cortex", "api", "status")).body)
    if pin == WRONG_PIN:
        assert not status["reachable"]
        assert (
            "pinned" in status["error"]["message"] and tls_backend.fingerprint in status["error"]["message"]
        )
        return
    assert status["reachable"] and status["authenticated"], status
    created = json.loads(
        (
            await jp_fetch(
                "cortex",
                "api",
                "v1",
                "jobs",
                method="POST",
                body=json.dumps({"sub_jobs": [{"type": "sampling", "base_model": "tiny"}]}),
            )
        ).body
    )
    try:
        listed = json.loads((await jp_fetch("cortex", "api", "v1", "jobs")).body)
        assert created["job_id"] in {job["job_id"] for job in listed["jobs"]}
    finally:
        await jp_fetch("cortex", "api", "v1", "jobs", created["job_id"], "cancel", method="POST", body=b"{}")
