"""The Tinker routes as an outsider sees them, in raw HTTP: malformed bodies, wrong types, another owner's key,
unknown ids. Every answer is a 4xx with our JSON error shape and a stable code, never a traceback, and never a
status the SDK would retry for minutes (408, 409, 429, 5xx). No SDK needed: these are the bodies it never sends."""

from __future__ import annotations

import httpx
import pytest
import zstandard

from .tinker_fixtures import TINKER_MODEL
from .tokens import create_token

RETRIED_BY_THE_SDK = {408, 409, 429} | set(range(500, 600))
PROTOBUF = {"Content-Type": "application/x-protobuf"}


@pytest.fixture(scope="module")
def keys(backend) -> tuple[str, str]:
    return (
        create_token(backend.data_dir, "attack-owner", "jobs:read", "jobs:write", tinker=True),
        create_token(backend.data_dir, "attack-other", "jobs:read", "jobs:write", tinker=True),
    )


def refused(response: httpx.Response, status: int, code: str, *words: str) -> None:
    assert response.status_code == status, response.text
    assert response.status_code not in RETRIED_BY_THE_SDK
    error = response.json()["error"]
    assert error["code"] == code and isinstance(error["message"], str), error
    for word in words:
        assert word in error["message"], error


def test_bad_bodies_and_other_owners_get_clear_refusals(backend, keys):
    owner, other = keys
    api = httpx.Client(base_url=backend.url + "/api/v1", timeout=60)
    mine, theirs = {"X-API-Key": owner}, {"X-API-Key": other}
    try:
        # keys and bodies
        refused(api.post("/create_session", json={}), 401, "unauthenticated")
        refused(
            api.post("/create_session", json={}, headers={"X-API-Key": "tml-not-a-key"}),
            401,
            "unauthenticated",
        )
        refused(api.post("/create_session", content=b"{not json", headers=mine), 400, "invalid_json")
        refused(api.post("/create_session", content=b'{"x": NaN}', headers=mine), 400, "invalid_json", "NaN")
        refused(api.post("/create_session", content=b"[1, 2]", headers=mine), 400, "invalid_json", "object")
        refused(
            api.post("/create_session", content=b"[" * 100_000 + b"]" * 100_000, headers=mine),
            400,
            "invalid_json",
            "nested",
        )
        session_id = api.post(
            "/create_session", json={"tags": [], "sdk_version": "0.38.0"}, headers=mine
        ).json()["session_id"]
        refused(
            api.post("/session_heartbeat", json={"session_id": 5}, headers=mine),
            400,
            "invalid_field",
            "session_id",
        )
        refused(
            api.post("/session_heartbeat", json={"session_id": session_id}, headers=theirs),
            404,
            "session_not_found",
        )

        # create_model: bad fields, another owner's session
        model = {
            "session_id": session_id,
            "model_seq_id": 0,
            "base_model": TINKER_MODEL,
            "lora_config": {"rank": 4},
        }
        refused(
            api.post("/create_model", json={"session_id": session_id}, headers=mine),
            400,
            "invalid_field",
            "model_seq_id",
        )
        refused(
            api.post("/create_model", json={**model, "lora_config": {"rank": -3}}, headers=mine),
            400,
            "invalid_field",
            "lora.r",
        )
        refused(
            api.post("/create_model", json={**model, "lora_config": {"rank": "8"}}, headers=mine),
            400,
            "invalid_field",
            "lora.r",
        )
        refused(
            api.post("/create_model", json={**model, "base_model": "../etc/passwd"}, headers=mine),
            400,
            "invalid_model_name",
        )
        refused(api.post("/create_model", json=model, headers=theirs), 404, "session_not_found")
        created = api.post("/create_model", json=model, headers=mine).json()
        model_id, future_id = created["model_id"], created["request_id"]

        # futures: unknown ids, wrong types, another owner's
        refused(
            api.post("/retrieve_future", json={"request_id": future_id}, headers=theirs),
            404,
            "request_not_found",
        )
        refused(
            api.post("/retrieve_future", json={"request_id": "req-unknown"}, headers=mine),
            404,
            "request_not_found",
        )
        refused(
            api.post("/retrieve_future", json={"request_id": 12}, headers=mine),
            400,
            "invalid_field",
            "request_id",
        )
        refused(api.post("/retrieve_future", json={}, headers=mine), 400, "invalid_field", "request_id")

        # training calls on another owner's model, and malformed ones on ours
        adam = {"learning_rate": 1e-3}
        refused(api.post("/get_info", json={"model_id": model_id}, headers=theirs), 404, "model_not_found")
        refused(
            api.post(
                "/optim_step", json={"model_id": model_id, "seq_id": 1, "adam_params": adam}, headers=theirs
            ),
            404,
            "model_not_found",
        )
        refused(
            api.post("/save_weights", json={"model_id": model_id, "path": "x", "seq_id": 1}, headers=theirs),
            404,
            "model_not_found",
        )
        refused(
            api.post(
                "/optim_step",
                json={"model_id": model_id, "seq_id": 1, "adam_params": {"learning_rate": "x"}},
                headers=mine,
            ),
            400,
            "invalid_field",
            "learning_rate",
        )
        refused(
            api.post(
                "/optim_step",
                json={"model_id": model_id, "seq_id": 10**30, "adam_params": adam},
                headers=mine,
            ),
            400,
            "invalid_field",
            "sequence",
        )
        refused(
            api.post("/optim_step", json={"model_id": model_id, "seq_id": 2}, headers=mine),
            400,
            "invalid_field",
            "adam_params",
        )
        refused(
            api.post(
                "/save_weights", json={"model_id": model_id, "path": "../../x", "seq_id": 3}, headers=mine
            ),
            400,
            "invalid_checkpoint_id",
        )
        refused(
            api.post("/forward_backward", content=b"\xff\xff\xff\x01garbage", headers={**mine, **PROTOBUF}),
            400,
            "invalid_request",
            "protobuf",
        )
        refused(
            api.post("/forward_backward", json={"model_id": model_id}, headers=mine),
            400,
            "invalid_request",
            "protobuf",
        )
        bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))
        refused(
            api.post(
                "/forward_backward", content=bomb, headers={**mine, **PROTOBUF, "Content-Encoding": "zstd"}
            ),
            413,
            "body_too_large",
        )
        refused(
            api.post(
                "/forward_backward",
                content=b"not zstd",
                headers={**mine, **PROTOBUF, "Content-Encoding": "zstd"},
            ),
            400,
            "invalid_request",
            "zstd",
        )

        # checkpoints, samplers and sessions of another owner; paths that are not ours to read
        refused(api.get(f"/training_runs/{model_id}/checkpoints", headers=theirs), 404, "model_not_found")
        refused(
            api.post("/weights_info", json={"tinker_path": f"tinker://{model_id}/weights/x"}, headers=theirs),
            404,
            "checkpoint_not_found",
        )
        sampler = {"session_id": session_id, "sampling_session_seq_id": 0}
        refused(
            api.post(
                "/create_sampling_session", json={**sampler, "model_path": "file:///etc/passwd"}, headers=mine
            ),
            400,
            "invalid_field",
            "tinker://",
        )
        refused(
            api.post(
                "/asample",
                json={"sampling_session_id": "unknown", "seq_id": 0, "num_samples": 1},
                headers=mine,
            ),
            404,
            "session_not_found",
        )
        refused(api.get(f"/sessions/{session_id}", headers=theirs), 404, "session_not_found")
        refused(api.post(f"/sessions/{session_id}/finish", json={}, headers=theirs), 404, "session_not_found")
        refused(api.post("/copy_weights", json={}, headers=mine), 400, "invalid_field", "tinker://")
        refused(api.post("/create_custom_loss", json={}, headers=mine), 400, "invalid_field", "session_id")
        refused(api.post("/no_such_call", json={}, headers=mine), 404, "route_not_found")

        # Listings: the other owner sees none of it, here or in our own API.
        runs = api.get("/training_runs", params={"limit": -1}, headers=mine).json()["training_runs"]
        assert [run["training_run_id"] for run in runs] == [model_id]
        assert api.get("/training_runs", headers=theirs).json()["training_runs"] == []
        job_id = model_id.replace(":", ".")
        assert job_id in [
            job["job_id"] for job in httpx.get(backend.url + "/v1/jobs", headers=mine).json()["jobs"]
        ]
        assert job_id not in [
            job["job_id"] for job in httpx.get(backend.url + "/v1/jobs", headers=theirs).json()["jobs"]
        ]
        assert api.post(f"/sessions/{session_id}/finish", json={}, headers=mine).status_code == 200
    finally:
        api.close()
