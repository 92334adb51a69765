"""The wire format: safetensors frames, chunked uploads checked by SHA-256, at-most-once requests."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from cortex_nb import Client
from cortex_nb.protocol import wire
from cortex_nb.protocol.errors import ApiError

from .reference import random_batch


def test_frame_round_trip_keeps_dtypes_shapes_and_metadata():
    tensors = {
        "input_ids": np.arange(12, dtype=np.int64).reshape(3, 4),
        "weights": np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4),
    }
    tensors_back, metadata = wire.decode_frame(
        wire.encode_frame(tensors, {"loss_fn": "ppo", "loss_fn_config": {"clip_low_threshold": 0.7}})
    )
    assert metadata == {"loss_fn": "ppo", "loss_fn_config": {"clip_low_threshold": 0.7}}
    for name, value in tensors.items():
        assert tensors_back[name].dtype == value.dtype
        np.testing.assert_array_equal(tensors_back[name], value)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"1234567",
        (10**9).to_bytes(8, "little") + b"{}",
        (2).to_bytes(8, "little") + b"[]",
        (4).to_bytes(8, "little") + b"nope",
    ],
)
def test_malformed_frames_are_refused_with_a_code(data):
    with pytest.raises(ApiError) as info:
        wire.decode_frame(data)
    assert info.value.code == "invalid_frame"


def test_object_dtype_frames_are_refused():
    header = b'{"x": {"dtype": "O", "shape": [1], "data_offsets": [0, 8]}}'
    data = len(header).to_bytes(8, "little") + header + b"\0" * 8
    with pytest.raises(ApiError) as info:
        wire.decode_frame(data)
    assert "dtype" in info.value.message


def test_chunk_assembly_checks_the_whole_frame():
    data = bytes(range(256)) * 100
    chunks = wire.split_chunks(data, 1000)
    assert len(chunks) == 26 and all(c.sha256 == wire.sha256_hex(c.data) for c in chunks)
    assert wire.assemble_chunks([c.data for c in chunks], wire.sha256_hex(data)) == data
    with pytest.raises(ApiError):
        wire.assemble_chunks([c.data for c in reversed(chunks)], wire.sha256_hex(data))


def test_a_chunked_frame_gives_the_same_result_as_one_body(client: Client):
    job = client.create_training_job("tiny", seed=8)
    try:
        batch = random_batch(np.random.default_rng(2), 259, 4, 32)
        whole = job.forward(batch).result()["tensors"]["logprobs"]
        client.max_body_bytes, client.chunk_bytes = 1024, 700
        chunked = job.forward(batch).result()["tensors"]["logprobs"]
        np.testing.assert_array_equal(whole, chunked)
        assert job.forward_backward(batch).result()["loss"] > 0
    finally:
        job.cancel()


def test_a_retried_chunked_request_runs_once(backend, client: Client):
    job = client.create_training_job("tiny", seed=8)
    headers = {"Authorization": f"Bearer {backend.token}"}
    try:
        frame = wire.encode_frame(
            random_batch(np.random.default_rng(3), 259, 2, 16), {"loss_fn": "cross_entropy"}
        )
        chunks = wire.split_chunks(frame, 512)
        upload = "up-retry-once"
        for chunk in chunks + chunks[:2]:  # resending chunks is harmless
            response = httpx.put(
                f"{backend.url}/v1/uploads/{upload}/chunks/{chunk.index}",
                content=chunk.data,
                headers={
                    **headers,
                    wire.CHUNK_SHA_HEADER: chunk.sha256,
                    wire.CHUNK_COUNT_HEADER: str(len(chunks)),
                },
            )
            assert response.status_code == 200, response.text
        submit_headers = {
            **headers,
            "Idempotency-Key": upload,
            wire.UPLOAD_HEADER: upload,
            wire.UPLOAD_SHA_HEADER: wire.sha256_hex(frame),
        }
        first = httpx.post(f"{backend.url}/v1/jobs/{job.job_id}/forward_backward", headers=submit_headers)
        again = httpx.post(f"{backend.url}/v1/jobs/{job.job_id}/forward_backward", headers=submit_headers)
        assert first.status_code == again.status_code == 202
        assert first.json()["request_id"] == again.json()["request_id"]
        assert again.headers.get("Idempotent-Replay") == "true"
        client.poll_request(job.job_id, first.json()["request_id"])
        assert job.step().result()["batches"] == 1  # the frame's gradients were applied exactly once
        # A chunk whose bytes do not match its declared hash is refused.
        bad = httpx.put(
            f"{backend.url}/v1/uploads/up-bad/chunks/0",
            content=b"abc",
            headers={**headers, wire.CHUNK_SHA_HEADER: "0" * 64, wire.CHUNK_COUNT_HEADER: "1"},
        )
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "chunk_mismatch"
    finally:
        job.cancel()


def test_idempotency_key_replays_and_refuses_a_different_body(backend, client: Client):
    job = client.create_training_job("tiny")
    headers = {"Authorization": f"Bearer {backend.token}", "Idempotency-Key": "step-key-1"}
    try:
        job.forward_backward(random_batch(np.random.default_rng(4), 259, 1, 8))
        first = httpx.post(f"{backend.url}/v1/jobs/{job.job_id}/step", json={}, headers=headers)
        again = httpx.post(f"{backend.url}/v1/jobs/{job.job_id}/step", json={}, headers=headers)
        assert first.json()["request_id"] == again.json()["request_id"]
        assert client.poll_request(job.job_id, first.json()["request_id"])["step"] == 1
        other = httpx.post(
            f"{backend.url}/v1/jobs/{job.job_id}/step", json={"learning_rate": 0.5}, headers=headers
        )
        assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
        # Creating a job with the same key twice creates one job.
        body = {"sub_jobs": [{"type": "sampling", "base_model": "tiny"}]}
        create_headers = {"Authorization": f"Bearer {backend.token}", "Idempotency-Key": "create-once"}
        a = httpx.post(f"{backend.url}/v1/jobs", json=body, headers=create_headers).json()
        b = httpx.post(f"{backend.url}/v1/jobs", json=body, headers=create_headers).json()
        assert a["job_id"] == b["job_id"]
        client.cancel_job(a["job_id"])
    finally:
        job.cancel()
