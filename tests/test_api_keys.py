"""Keys with the Tinker SDK's `tml-` prefix, sent as `X-API-Key`, are ordinary tokens: same scopes, same owners."""

from __future__ import annotations

import httpx

from .tokens import create_token


def _get(backend, path: str, **headers: str) -> httpx.Response:
    return httpx.get(backend.url + path, headers=headers, timeout=30)


def test_a_tinker_key_authenticates_as_x_api_key_or_bearer(backend):
    key = create_token(backend.data_dir, "tina", "jobs:read", "jobs:write", tinker=True)
    assert key.startswith("tml-") and len(key) > 30
    as_api_key = _get(backend, "/v1/whoami", **{"X-API-Key": key})
    as_bearer = _get(backend, "/v1/whoami", Authorization=f"Bearer {key}")
    assert as_api_key.status_code == as_bearer.status_code == 200
    assert as_api_key.json() == as_bearer.json()
    assert as_api_key.json()["owner"] == "tina" and as_api_key.json()["scopes"] == ["jobs:read", "jobs:write"]


def test_a_tinker_key_keeps_its_scopes_and_its_owner(backend, client):
    reader = create_token(backend.data_dir, "tim", "jobs:read", tinker=True)
    refused = httpx.post(
        backend.url + "/v1/jobs",
        headers={"X-API-Key": reader},
        json={"sub_jobs": [{"type": "sampling", "base_model": "tiny"}]},
        timeout=30,
    )
    assert refused.status_code == 403 and refused.json()["error"]["detail"]["missing_scopes"] == [
        "jobs:write"
    ]
    # Another owner's job is as invisible to a Tinker key as to any token.
    job = client.create_sampler("tiny")
    try:
        other = create_token(backend.data_dir, "tom", "jobs:read", "jobs:write", tinker=True)
        assert _get(backend, f"/v1/jobs/{job.job_id}", **{"X-API-Key": other}).status_code == 404
        listed = _get(backend, "/v1/jobs", **{"X-API-Key": other}).json()["jobs"]
        assert job.job_id not in [row["job_id"] for row in listed]
    finally:
        job.cancel()


def test_an_unknown_key_is_refused_and_named(backend):
    response = _get(backend, "/v1/whoami", **{"X-API-Key": "tml-not-a-key"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthenticated"
    missing = _get(backend, "/v1/whoami")
    assert missing.status_code == 401 and "X-API-Key" in missing.json()["error"]["message"]
