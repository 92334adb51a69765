"""Chunk groups of the Cortex face are bounded per owner: chunks go to disk as they arrive, an owner's open
groups may hold its share (`--upload-quota-bytes`) and no more, `total_chunks` is bounded, and while one
owner floods, another owner's chunked forward_backward through the published `cortex-training` SDK runs."""

from __future__ import annotations

import math

import httpx
import pytest
import torch
from cortex_training import (
    CortexTrainingClient,
    SubJobConfig,
    build_forward_backward_kwargs,
    serialize_forward_backward_args,
)
from cortex_training import wire as sdk_wire

from .backend_process import start_backend
from .tokens import create_token

MIB = 1024 * 1024
SHARE = 64 * MIB
CHUNK = 16 * MIB
PATH = "/api/v2/databases/DB/schemas/SCHEMA/cortex-training/{job_id}/forward-backward"

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    process = start_backend(
        tmp_path_factory.mktemp("chunk-limits"),
        "--tls",
        "self-signed",
        "--devices",
        "cpu:2",
        "--worker-threads",
        "1",
        "--upload-quota-bytes",
        str(SHARE),
    )
    yield process
    process.stop()


def spooled_bytes(backend) -> int:
    root = backend.data_dir / "cortex-chunk-groups"
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file()) if root.exists() else 0


def test_one_owners_chunk_flood_is_bounded_and_another_owner_trains(shared, monkeypatch):
    flooder = create_token(shared.data_dir, "chunk-flooder", "jobs:read", "jobs:write")
    trainer = create_token(shared.data_dir, "chunk-trainer", "jobs:read", "jobs:write")
    api = httpx.Client(
        base_url=shared.url, verify=False, timeout=120, headers={"Authorization": f"Bearer {flooder}"}
    )
    try:
        job_id = api.post("/v1/jobs", json={"sub_jobs": [{"type": "sampling", "base_model": "tiny"}]}).json()[
            "job_id"
        ]
        path = PATH.format(job_id=job_id)
        first = sdk_wire.encode_byte_chunks(
            b"\1" * (40 * MIB), kind="request", operation="fwd-bwd", max_bytes=CHUNK
        )
        second = sdk_wire.encode_byte_chunks(
            b"\2" * (40 * MIB), kind="request", operation="fwd-bwd", max_bytes=CHUNK
        )
        assert len(first) == len(second) == 3
        for chunk in first[:2]:
            answer = api.post(path, content=chunk)
            assert answer.status_code == 200 and answer.json()["status"] == "received", answer.text
        # What the open group holds is on disk, not in the backend's memory.
        assert spooled_bytes(shared) >= 30 * MIB
        # A second group would take the owner past its share: refused at once, with the share named.
        refused = api.post(path, content=second[0])
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert error["code"] == "quota_exceeded" and error["detail"]["quota_bytes"] == SHARE, error
        # A chunk that claims more chunks than its frame has bytes (or than any frame needs) is refused.
        endless = sdk_wire._make_byte_chunk_frame(
            b"abc",
            kind="request",
            operation="fwd-bwd",
            group_id="endless",
            chunk_idx=0,
            total_chunks=10**9,
            start=0,
            end=3,
        )
        answer = api.post(path, content=endless)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_frame", answer.text

        # Meanwhile another owner's chunked forward_backward runs, through the SDK.
        for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("CORTEX_TRAINING_DISABLE_TELEMETRY", "1")
        sdk = CortexTrainingClient.from_pat(
            shared.url.removeprefix("https://"), trainer, "DB", "SCHEMA", verify_ssl=False
        )
        try:
            config = SubJobConfig.training_job(
                "tiny", optimizer={"lr": 1e-3}, max_seq_len=512, train_batch_size=2, n_gpus=1
            )
            trained = sdk.create_job([config], idle_timeout_seconds=0)
            sdk.wait_for_job(trained)
            sdk._MAX_FWD_BWD_BYTES = 16 * 1024  # the SDK's own chunk size: four chunks
            tokens = (torch.arange(2000).reshape(4, 500) % 250).tolist()
            batch = build_forward_backward_kwargs({"input_ids": tokens, "attention_mask": [[1] * 500] * 4})
            frame = serialize_forward_backward_args((), batch)
            assert len(frame) > sdk._MAX_FWD_BWD_BYTES  # chunked
            result = sdk.poll_request(trained, sdk.forward_backward(trained, frame))
            assert math.isfinite(result["loss"])
            sdk.cancel_job(trained)
        finally:
            sdk.close()

        # The flooder's group completes (into a frame that is no batch): its chunks are freed, room again.
        finished = api.post(path, content=first[2])
        assert finished.status_code == 400 and finished.json()["error"]["code"] == "invalid_frame"
        assert spooled_bytes(shared) == 0
        assert api.post(path, content=second[0]).status_code == 200
    finally:
        api.close()
