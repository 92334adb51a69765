"""Regression tests for what an outside audit broke in the HTTP API (issue 13): non-finite numbers, 500s on
malformed input, ids ending in a newline, frames without a loss, refusals that broke keep-alive, run logs
readable through a job of the same id or unredacted by an admin, and taken job ids named to anyone."""

from __future__ import annotations

import http.client
import json
import socket
import struct
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from cortex_nb import Client, wire

from .reference import random_batch
from .run_projects import write_project
from .test_bad_input import FRAME_HEADERS, _assert_error, _healthy, _post
from .tokens import create_token


@pytest.fixture(scope="module")
def running_job(backend):
    with Client(backend.url, backend.token) as client:
        job = client.create_training_job("tiny")
        yield job.job_id
        job.cancel()


def _strict(response: httpx.Response):
    """Parse as a browser would: NaN or Infinity in a response fails here."""

    def refuse(name: str):
        raise AssertionError(f"the response holds {name}, which is not JSON: {response.text[:300]}")

    return json.loads(response.content, parse_constant=refuse)


# finding 7 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(backend, running_job, constant):
    bodies = {
        "/v1/jobs": [
            '{"hardware": {"min_memory_gib": %s}, "sub_jobs": [{"type": "sampling", "base_model": "tiny"}]}',
            '{"idle_timeout_s": %s, "sub_jobs": [{"type": "sampling", "base_model": "tiny"}]}',
            '{"sub_jobs": [{"type": "training", "base_model": "tiny", "optimizer": {"lr": %s}}]}',
        ],
        f"/v1/jobs/{running_job}/step": ['{"learning_rate": %s}'],
        f"/v1/jobs/{running_job}/generate": ['{"prompts": ["a"], "sampling_params": {"temperature": %s}}'],
    }
    for path, templates in bodies.items():
        for template in templates:
            error = _assert_error(
                _post(
                    backend,
                    path,
                    content=(template % constant).encode(),
                    headers={"Content-Type": "application/json"},
                ),
                400,
                "invalid_json",
            )
            assert constant.lstrip("-") in error["message"]
    batch = random_batch(np.random.default_rng(0), 259, 1, 8)
    batch["logprobs"] = np.zeros((1, 8), np.float32)
    batch["advantages"] = np.ones((1, 8), np.float32)
    frame = wire.encode_frame(
        batch, {"loss_fn": "ppo", "loss_fn_config": {"clip_low_threshold": float(constant)}}
    )
    _assert_error(
        _post(backend, f"/v1/jobs/{running_job}/forward_backward", content=frame, headers=FRAME_HEADERS),
        400,
        "invalid_frame",
    )
    batch["advantages"][0, 0] = float(constant)
    _assert_error(
        _post(
            backend,
            f"/v1/jobs/{running_job}/forward_backward",
            content=wire.encode_frame(batch, {"loss_fn": "ppo"}),
            headers=FRAME_HEADERS,
        ),
        400,
        "invalid_batch",
    )
    _healthy(backend, running_job)


def test_numbers_have_upper_bounds(backend):
    error = _assert_error(
        _post(
            backend,
            "/v1/jobs",
            json={
                "hardware": {"min_memory_gib": 1e300},
                "sub_jobs": [{"type": "sampling", "base_model": "tiny"}],
            },
        ),
        400,
        "invalid_field",
    )
    assert error["detail"]["field"] == "hardware.min_memory_gib"
    for field, value in (("alpha", 1e300), ("r", 10**30)):
        body = {"sub_jobs": [{"type": "training", "base_model": "tiny", "lora": {field: value}}]}
        assert _assert_error(_post(backend, "/v1/jobs", json=body), 400, "invalid_field")["detail"][
            "field"
        ].endswith(field)


def test_a_diverged_loss_is_answered_as_strict_json(backend, running_job):
    """A result holding infinity (a legitimately diverged loss) must not make the response unreadable."""
    batch = random_batch(np.random.default_rng(1), 259, 1, 8)
    batch["logprobs"] = np.full((1, 8), -3e38, np.float32)  # finite, but exp(logprob - this) overflows
    batch["advantages"] = np.ones((1, 8), np.float32)
    with Client(backend.url, backend.token) as client:
        request_id = client.forward_backward(running_job, batch, "importance_sampling")
        client.poll_request(running_job, request_id)
    response = httpx.get(
        f"{backend.url}/v1/jobs/{running_job}/requests/{request_id}",
        headers={"Authorization": f"Bearer {backend.token}"},
        timeout=30,
    )
    assert response.status_code == 200
    body = _strict(response)
    assert body["result"]["loss"] is None  # infinity, written as null
    listing = httpx.get(
        f"{backend.url}/v1/jobs", headers={"Authorization": f"Bearer {backend.token}"}, timeout=30
    )
    _strict(listing)


# finding 9 -----------------------------------------------------------------------------------------
def test_malformed_input_is_a_400_never_a_500(backend, running_job):
    deep = b"[" * 100_000 + b"]" * 100_000
    _assert_error(_post(backend, "/v1/jobs", content=deep), 400, "invalid_json")
    _assert_error(
        _post(backend, "/v1/jobs", content=b'{"job_id": ' + b"7" * 5000 + b"}"), 400, "invalid_json"
    )

    def frame_with_header(header: bytes) -> bytes:
        return struct.pack("<Q", len(header)) + header

    for header in (
        b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"a": {"dtype": "F32", "shape": [' + b"9" * 5000 + b"]}}",
        b'{"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}',
        b'{"__metadata__": [1]}',
        b'{"__metadata__": {"cortex": {"loss_fn": "ppo"}}}',
    ):
        _assert_error(
            _post(
                backend,
                f"/v1/jobs/{running_job}/forward_backward",
                content=frame_with_header(header),
                headers=FRAME_HEADERS,
            ),
            400,
            "invalid_frame",
        )
    for tokens in ([[-1]], [[10**12]], [[259]]):
        error = _assert_error(
            _post(backend, "/v1/models/tiny/detokenize", json={"tokens": tokens}), 400, "invalid_field"
        )
        assert "outside" in error["message"]
    _assert_error(
        _post(backend, "/v1/models/tiny/tokenize", json={"texts": ["x" * (2 << 20)]}), 400, "invalid_field"
    )
    chunk = b"abc"
    for index, count in (("\u00b2", "1"), ("0", "\u00b2"), ("0", "\u0663")):
        response = httpx.put(
            f"{backend.url}/v1/uploads/up-1/chunks/{index}",
            content=chunk,
            timeout=30,
            headers={
                "Authorization": f"Bearer {backend.token}",
                wire.CHUNK_COUNT_HEADER: count.encode(),
                wire.CHUNK_SHA_HEADER: wire.sha256_hex(chunk),
            },
        )
        _assert_error(response, 400, "invalid_field")
    _healthy(backend, running_job)


# finding 10 ----------------------------------------------------------------------------------------
def test_ids_ending_in_a_newline_are_refused(backend, running_job, tmp_path):
    for job_id in ("abc\n", "abc\r\n"):
        body = {"job_id": job_id, "sub_jobs": [{"type": "sampling", "base_model": "tiny"}]}
        assert (
            _assert_error(_post(backend, "/v1/jobs", json=body), 400, "invalid_field")["detail"]["field"]
            == "job_id"
        )
    response = _post(backend, f"/v1/jobs/{running_job}/save", json={"checkpoint_id": "ck\n"})
    assert response.status_code == 400, response.text
    spec = {"version": 1, "name": "newline\n", "command": ["true"]}
    _assert_error(_post(backend, "/v1/runs", json={"spec": spec}), 400, "spec_invalid")
    spec = {"version": 1, "name": "ok", "command": ["true"], "outputs": {"out\n": "out.txt"}}
    _assert_error(_post(backend, "/v1/runs", json={"spec": spec}), 400, "spec_invalid")
    _assert_error(
        _post(
            backend,
            "/v1/runs",
            json={"submission_id": "s\n", "spec": {"version": 1, "name": "ok", "command": ["true"]}},
        ),
        400,
        "invalid_field",
    )


# finding 11 ----------------------------------------------------------------------------------------
def test_a_frame_without_a_loss_is_refused(backend, running_job):
    batch = random_batch(np.random.default_rng(0), 259, 1, 8)
    error = _assert_error(
        _post(
            backend,
            f"/v1/jobs/{running_job}/forward_backward",
            content=wire.encode_frame(batch, {}),
            headers=FRAME_HEADERS,
        ),
        400,
        "invalid_frame",
    )
    assert error["detail"]["field"] == "loss_fn"
    _healthy(backend, running_job)


# finding 12 ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reader(backend):
    return create_token(backend.data_dir, "reader-keepalive", "jobs:read")


@pytest.mark.parametrize("case", ["unauthenticated", "forbidden", "route_not_found", "method_not_allowed"])
def test_an_early_refusal_keeps_the_client_connection_usable(backend, reader, case):
    method, path, token = {
        "unauthenticated": ("POST", "/v1/jobs", "ctx_wrong"),
        "forbidden": ("POST", "/v1/jobs", reader),
        "route_not_found": ("POST", "/v1/nothing-here", backend.token),
        "method_not_allowed": ("PUT", "/v1/jobs", backend.token),
    }[case]
    address = urlsplit(backend.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        body = json.dumps({"sub_jobs": [{"type": "sampling", "base_model": "tiny", "pad": "x" * 200_000}]})
        connection.request(
            method,
            path,
            body=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        refused = connection.getresponse()
        refused.read()
        assert refused.status in (401, 403, 404, 405)
        assert refused.getheader("Connection", "").lower() == "close"
        # The same client object goes on: it reconnects because it was told to.
        connection.request("GET", "/version")
        follow_up = connection.getresponse()
        assert follow_up.status == 200 and json.loads(follow_up.read())["service"] == "cortex-nb-backend"
    finally:
        connection.close()


def test_a_refusal_after_the_body_was_read_keeps_the_connection_alive(backend):
    address = urlsplit(backend.url)
    raw = socket.create_connection((address.hostname, address.port), timeout=30)
    try:
        body = b"{not json"
        request = (
            f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {backend.token}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        raw.sendall(request + b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while received.count(b"HTTP/1.1 ") < 2 or not received.rstrip().endswith(b"}"):
            chunk = raw.recv(65536)
            if not chunk:
                break
            received += chunk
        assert received.startswith(b"HTTP/1.1 400") and b"HTTP/1.1 200" in received
        assert b"connection: close" not in received.lower()
    finally:
        raw.close()


# findings 3, 13, 14 ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def owners(runs_backend):
    scopes = ("jobs:read", "jobs:write", "runs:write")
    return {name: create_token(runs_backend.data_dir, name, *scopes) for name in ("alice-audit", "bob-audit")}


def test_a_job_named_like_a_run_never_reads_its_logs(runs_backend, owners, tmp_path):
    with Client(runs_backend.url, owners["alice-audit"]) as alice:
        handle = alice.run(write_project(tmp_path, "print('alice private line')", name="private"))
        assert handle.wait(120)["status"] == "done"
        assert any("alice private line" in line for line in handle.logs())
    body = {"job_id": handle.run_id, "sub_jobs": [{"type": "sampling", "base_model": "tiny"}]}
    error = _assert_error(
        _post(runs_backend, "/v1/jobs", token=owners["bob-audit"], json=body), 400, "invalid_field"
    )
    assert error["detail"]["field"] == "job_id" and "run-" in error["message"]
    # Whatever id a job has, its logs are job logs: the run's lines are not there.
    for token in (owners["bob-audit"], runs_backend.token):
        response = httpx.get(
            f"{runs_backend.url}/v1/jobs/{handle.run_id}/logs",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert response.status_code == 404 and "alice private line" not in response.text


def test_an_admin_reads_run_logs_redacted_and_the_owner_does_not(runs_backend, owners, tmp_path):
    secret = "ctx_" + "s3cr3t" * 6
    with Client(runs_backend.url, owners["alice-audit"]) as alice:
        handle = alice.run(write_project(tmp_path, f"print('my token={secret}')", name="leaky"))
        assert handle.wait(120)["status"] == "done"
        assert any(secret in line for line in handle.logs())
    response = httpx.get(
        f"{runs_backend.url}/v1/runs/{handle.run_id}/logs",
        headers={"Authorization": f"Bearer {runs_backend.token}"},
        timeout=30,
    )
    lines = [line["line"] for line in response.json()["lines"]]
    assert any("my token=" in line for line in lines), lines
    assert not any(secret in line for line in lines) and any("[REDACTED]" in line for line in lines)


def test_a_taken_job_id_is_answered_the_same_whoever_owns_it(runs_backend, owners):
    body = {"job_id": "audit-shared-id", "sub_jobs": [{"type": "sampling", "base_model": "tiny"}]}
    created = _post(runs_backend, "/v1/jobs", token=owners["alice-audit"], json=body)
    assert created.status_code == 201, created.text
    try:
        as_bob = _assert_error(
            _post(runs_backend, "/v1/jobs", token=owners["bob-audit"], json=body), 409, "job_id_unavailable"
        )
        as_alice = _assert_error(
            _post(runs_backend, "/v1/jobs", token=owners["alice-audit"], json=body), 409, "job_id_unavailable"
        )
        assert as_bob == as_alice
        assert "alice" not in json.dumps(as_bob) and "exist" not in as_bob["message"]
    finally:
        httpx.post(
            f"{runs_backend.url}/v1/jobs/audit-shared-id/cancel",
            timeout=30,
            headers={"Authorization": f"Bearer {owners['alice-audit']}"},
        )


# finding 6 -----------------------------------------------------------------------------------------
def test_a_large_frame_reaches_the_worker_intact_through_chunks(backend, running_job):
    """The chunked path (assembled into a memory map, checked as views, written to the worker in slices)
    gives the same result as the same batch sent in one body."""
    batch = random_batch(np.random.default_rng(7), 259, 4, 16)
    # A tensor no loss reads makes the frame 2 MB, past what goes to a worker in one write.
    ballasted = {**batch, "ballast": np.zeros(512 * 1024, np.float32)}
    with Client(backend.url, backend.token) as direct, Client(backend.url, backend.token) as chunked:
        chunked.max_body_bytes, chunked.chunk_bytes = 4096, 256 * 1024
        first = direct.poll_request(running_job, direct.forward_backward(running_job, batch))
        second = chunked.poll_request(running_job, chunked.forward_backward(running_job, ballasted))
    assert first["loss"] == pytest.approx(second["loss"], rel=1e-6)
    assert first["metrics"]["tokens:sum"] == second["metrics"]["tokens:sum"]
