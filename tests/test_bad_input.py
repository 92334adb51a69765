"""Bad input gets a 4xx with a stable error code, never a traceback, and the service stays healthy."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from cortex_nb import Client
from cortex_nb.protocol import wire

from .reference import random_batch
from .tokens import create_token


@pytest.fixture(scope="module")
def running_job(backend):
    with Client(backend.url, backend.token) as client:
        job = client.create_training_job("tiny")
        yield job.job_id
        job.cancel()


def _post(backend, path, token=None, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token or backend.token}", **kwargs.pop("headers", {})}
    return httpx.post(backend.url + path, headers=headers, timeout=60, **kwargs)


def _assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert body["error"]["message"] and "Traceback" not in body["error"]["message"]
    return body["error"]


def _frame(batch, loss_fn="cross_entropy"):
    return wire.encode_frame(batch, {"loss_fn": loss_fn})


FRAME_HEADERS = {"Content-Type": wire.FRAME_CONTENT_TYPE}


def _healthy(backend, job_id):
    assert httpx.get(backend.url + "/version", timeout=10).status_code == 200
    with Client(backend.url, backend.token) as client:
        batch = random_batch(np.random.default_rng(0), 259, 1, 8)
        assert client.poll_request(job_id, client.forward_backward(job_id, batch))["loss"] > 0


def test_malformed_frame(backend, running_job):
    for body in (b"", b"garbage", b"\xff" * 8 + b"{}", (5).to_bytes(8, "little") + b"[1,2]"):
        _assert_error(
            _post(backend, f"/v1/jobs/{running_job}/forward_backward", content=body, headers=FRAME_HEADERS),
            400,
            "invalid_frame",
        )
    _healthy(backend, running_job)


def test_unknown_loss(backend, running_job):
    batch = random_batch(np.random.default_rng(0), 259, 1, 8)
    error = _assert_error(
        _post(
            backend,
            f"/v1/jobs/{running_job}/forward_backward",
            content=_frame(batch, "mse"),
            headers=FRAME_HEADERS,
        ),
        400,
        "unknown_loss",
    )
    assert "cross_entropy" in error["message"]
    _healthy(backend, running_job)


def test_mismatched_tensor_shapes(backend, running_job):
    batch = random_batch(np.random.default_rng(0), 259, 2, 8)
    batch["weights"] = batch["weights"][:, :5]
    error = _assert_error(
        _post(
            backend, f"/v1/jobs/{running_job}/forward_backward", content=_frame(batch), headers=FRAME_HEADERS
        ),
        400,
        "invalid_batch",
    )
    assert "weights" in error["message"]
    out_of_vocab = random_batch(np.random.default_rng(0), 259, 1, 8)
    out_of_vocab["input_ids"][0, 0] = 100_000
    _assert_error(
        _post(
            backend,
            f"/v1/jobs/{running_job}/forward_backward",
            content=_frame(out_of_vocab),
            headers=FRAME_HEADERS,
        ),
        400,
        "invalid_batch",
    )
    missing = {"input_ids": batch["input_ids"]}
    _assert_error(
        _post(
            backend,
            f"/v1/jobs/{running_job}/forward_backward",
            content=_frame(missing),
            headers=FRAME_HEADERS,
        ),
        400,
        "invalid_batch",
    )
    _healthy(backend, running_job)


def test_two_training_sub_jobs(backend, running_job):
    body = {
        "sub_jobs": [{"type": "training", "base_model": "tiny"}, {"type": "training", "base_model": "tiny"}]
    }
    _assert_error(_post(backend, "/v1/jobs", json=body), 400, "too_many_training_sub_jobs")
    _healthy(backend, running_job)


def test_unknown_model_and_path_like_names(backend, running_job):
    _assert_error(
        _post(backend, "/v1/jobs", json={"sub_jobs": [{"type": "training", "base_model": "llama-70b"}]}),
        400,
        "unknown_model",
    )
    for name in ("/etc/passwd", "../models/x", "~/model", "http://example.com/model", "models/../../x"):
        _assert_error(
            _post(backend, "/v1/jobs", json={"sub_jobs": [{"type": "sampling", "base_model": name}]}),
            400,
            "invalid_model_name",
        )
    _healthy(backend, running_job)


def test_invalid_fields_are_named(backend, running_job):
    error = _assert_error(
        _post(
            backend,
            "/v1/jobs",
            json={"sub_jobs": [{"type": "training", "base_model": "tiny", "lora": {"r": -1}}]},
        ),
        400,
        "invalid_field",
    )
    assert error["detail"]["field"] == "sub_jobs[0].lora.r"
    error = _assert_error(
        _post(backend, "/v1/jobs", json={"sub_jobs": [], "color": "red"}), 400, "invalid_field"
    )
    assert error["detail"]["field"] == "job.color"
    # A LoRA module the model does not have is refused here, not when the worker applies the adapter.
    error = _assert_error(
        _post(
            backend,
            "/v1/jobs",
            json={
                "sub_jobs": [
                    {
                        "type": "training",
                        "base_model": "small-gpt2",
                        "lora": {"target_modules": ["c_attn", "q_proj"]},
                    }
                ]
            },
        ),
        400,
        "invalid_field",
    )
    assert error["detail"]["field"] == "sub_jobs[0].lora.target_modules"
    assert "model small-gpt2 has no module 'q_proj'" in error["message"] and "c_attn" in error["message"]
    _assert_error(_post(backend, "/v1/jobs", content=b"{not json"), 400, "invalid_json")
    _assert_error(
        _post(
            backend,
            f"/v1/jobs/{running_job}/generate",
            json={"prompts": ["a"], "sampling_params": {"top_p": 0}},
        ),
        400,
        "invalid_field",
    )
    _assert_error(
        _post(backend, f"/v1/jobs/{running_job}/generate", json={"prompts": [], "sampling_params": {}}),
        400,
        "invalid_field",
    )
    error = _assert_error(
        _post(backend, f"/v1/jobs/{running_job}/step", json={"betas": [1.5, 0.9]}), 400, "invalid_field"
    )
    assert error["detail"]["field"] == "betas[0]"
    error = _assert_error(
        _post(backend, f"/v1/jobs/{running_job}/step", json={"momentum": 0.9}), 400, "invalid_field"
    )
    assert error["detail"]["field"] == "momentum"
    _healthy(backend, running_job)


def test_oversized_body(backend, running_job):
    body = b"\0" * (wire.MAX_BODY_BYTES + 1024)
    _assert_error(
        _post(backend, f"/v1/jobs/{running_job}/forward_backward", content=body, headers=FRAME_HEADERS),
        413,
        "body_too_large",
    )
    _healthy(backend, running_job)


def test_wrong_token_and_missing_scope(backend, running_job):
    _assert_error(
        httpx.get(backend.url + "/v1/jobs", headers={"Authorization": "Bearer ctx_wrong"}),
        401,
        "unauthenticated",
    )
    _assert_error(httpx.get(backend.url + "/v1/jobs"), 401, "unauthenticated")
    reader = create_token(backend.data_dir, "reader", "jobs:read")
    error = _assert_error(
        _post(
            backend, "/v1/jobs", token=reader, json={"sub_jobs": [{"type": "training", "base_model": "tiny"}]}
        ),
        403,
        "forbidden",
    )
    assert error["detail"]["missing_scopes"] == ["jobs:write"]
    with Client(backend.url, reader) as client:
        from cortex_nb.errors import PermissionError as CortexPermissionError

        with pytest.raises(CortexPermissionError) as info:
            client.create_job([{"type": "training", "base_model": "tiny"}])
        assert info.value.missing_scopes == ["jobs:write"]
    _healthy(backend, running_job)


def test_another_users_job_is_invisible(backend, running_job):
    alice = create_token(backend.data_dir, "alice", "jobs:read", "jobs:write")
    bob = create_token(backend.data_dir, "bob", "jobs:read", "jobs:write")
    with Client(backend.url, alice) as as_alice, Client(backend.url, bob) as as_bob:
        job = as_alice.create_job([{"type": "sampling", "base_model": "tiny"}])
        for call in (
            lambda: as_bob.get_job(job["job_id"]),
            lambda: as_bob.cancel_job(job["job_id"]),
            lambda: as_bob.generate(job["job_id"], ["x"]),
        ):
            with pytest.raises(Exception) as info:
                call()
            assert info.value.code == "job_not_found" and info.value.status == 404
        assert job["job_id"] not in {j["job_id"] for j in as_bob.list_jobs()}
        assert job["job_id"] in {j["job_id"] for j in as_alice.list_jobs()}
        as_alice.cancel_job(job["job_id"])
    # The admin sees everyone's jobs.
    with Client(backend.url, backend.token) as admin:
        assert job["job_id"] in {j["job_id"] for j in admin.list_jobs(limit=500)}
    _healthy(backend, running_job)


def test_unknown_route_and_method(backend):
    _assert_error(
        httpx.get(backend.url + "/v1/nothing-here", headers={"Authorization": f"Bearer {backend.token}"}),
        404,
        "route_not_found",
    )
    _assert_error(
        httpx.delete(backend.url + "/v1/jobs", headers={"Authorization": f"Bearer {backend.token}"}),
        405,
        "method_not_allowed",
    )
    assert json.loads(httpx.get(backend.url + "/version").text)["api_version"].startswith("1.")
