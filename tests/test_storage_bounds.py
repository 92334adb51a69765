"""Storage that used to grow without bound: unused upload chunks expire and are capped per owner,
Idempotency-Keys are forgotten after their TTL, finished jobs and runs after their retention, and the
checkpoint quota is on by default."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time

import httpx
import pytest
from cortex_backend.cli import add_backend_commands
from cortex_backend.config import BackendSettings

from cortex_nb.protocol import wire

from .backend_process import start_backend
from .tokens import create_token

MIB = 2**20


def _put_chunk(backend, token: str, upload_id: str, data: bytes) -> httpx.Response:
    return httpx.put(
        f"{backend.url}/v1/uploads/{upload_id}/chunks/0",
        content=data,
        timeout=60,
        headers={
            "Authorization": f"Bearer {token}",
            wire.CHUNK_COUNT_HEADER: "2",
            wire.CHUNK_SHA_HEADER: wire.sha256_hex(data),
        },
    )


def _wait_for(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def test_one_owner_cannot_hold_more_unused_chunks_than_its_quota(tmp_path):
    backend = start_backend(
        tmp_path / "quota",
        "--devices",
        "cpu:1",
        "--warm-workers",
        "0",
        "--upload-quota-bytes",
        "20MiB",
        "--dataset-quota-bytes",
        "4KiB",
    )
    try:
        other = create_token(backend.data_dir, "other-uploader", "jobs:write")
        chunk = os.urandom(8 * MIB)
        for index in range(2):
            assert _put_chunk(backend, backend.token, f"up-q{index}", chunk).status_code == 200
        refused = _put_chunk(backend, backend.token, "up-q2", chunk)
        assert refused.status_code == 413 and refused.json()["error"]["code"] == "quota_exceeded"
        assert "--upload-quota-bytes" in refused.json()["error"]["message"]
        # The cap is per owner: someone else may still upload.
        assert _put_chunk(backend, other, "up-q0", chunk).status_code == 200
        # Training datasets are capped per owner too.
        small, large = (
            ("\n".join(json.dumps({"text": "x" * 60}) for _ in range(n)) + "\n").encode() for n in (10, 60)
        )
        for body, status in ((small, 200), (large, 413)):
            answer = httpx.put(
                f"{backend.url}/v1/datasets/{hashlib.sha256(body).hexdigest()}",
                content=body,
                timeout=60,
                headers={"Authorization": f"Bearer {backend.token}"},
            )
            assert answer.status_code == status, answer.text
    finally:
        backend.stop()


def test_unused_chunks_idempotency_keys_and_finished_history_are_forgotten(tmp_path):
    backend = start_backend(
        tmp_path / "expiry",
        "--devices",
        "cpu:1",
        "--warm-workers",
        "0",
        "--upload-ttl",
        "2",
        "--idempotency-ttl",
        "2",
        "--history-retention-days",
        str(3 / 86400),
    )
    try:
        headers = {"Authorization": f"Bearer {backend.token}"}
        assert _put_chunk(backend, backend.token, "up-orphan", b"x" * 4096).status_code == 200
        uploads = backend.data_dir / "uploads"
        assert any(path.is_file() for path in uploads.rglob("*"))

        body = {"sub_jobs": [{"type": "sampling", "base_model": "tiny"}]}
        first = httpx.post(
            f"{backend.url}/v1/jobs", json=body, timeout=60, headers={**headers, "Idempotency-Key": "k-1"}
        )
        assert first.status_code == 201
        job_id = first.json()["job_id"]
        replay = httpx.post(
            f"{backend.url}/v1/jobs", json=body, timeout=60, headers={**headers, "Idempotency-Key": "k-1"}
        )
        assert replay.json()["job_id"] == job_id and replay.headers.get("Idempotent-Replay") == "true"
        httpx.post(f"{backend.url}/v1/jobs/{job_id}/cancel", headers=headers, timeout=60).raise_for_status()

        assert _wait_for(lambda: not any(path.is_file() for path in uploads.rglob("*")))
        assert _wait_for(
            lambda: (
                httpx.get(f"{backend.url}/v1/jobs/{job_id}", headers=headers, timeout=60).status_code == 404
            )
        )
        with sqlite3.connect(backend.data_dir / "cortex.sqlite3") as db:
            for table, column in (
                ("jobs", "id"),
                ("sub_jobs", "job_id"),
                ("requests", "job_id"),
                ("events", "job_id"),
                ("logs", "job_id"),
            ):
                assert (
                    db.execute(f"SELECT COUNT(*) FROM {table} WHERE {column} = ?", (job_id,)).fetchone()[0]
                    == 0
                ), table
            assert db.execute("SELECT COUNT(*) FROM idempotency").fetchone()[0] == 0
        again = httpx.post(
            f"{backend.url}/v1/jobs", json=body, timeout=60, headers={**headers, "Idempotency-Key": "k-1"}
        )
        assert again.status_code == 201 and again.json()["job_id"] != job_id
        httpx.post(f"{backend.url}/v1/jobs/{again.json()['job_id']}/cancel", headers=headers, timeout=60)
    finally:
        backend.stop()


def test_the_checkpoint_quota_and_other_bounds_are_on_by_default(capsys):
    settings = BackendSettings()
    assert settings.checkpoint_quota_bytes == 50 * 1024**3
    assert settings.upload_quota_bytes and settings.upload_ttl_s and settings.history_retention_s
    import argparse

    parser = argparse.ArgumentParser(prog="cortex-backend")
    add_backend_commands(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in (
        "--checkpoint-quota-bytes",
        "--upload-ttl",
        "--upload-quota-bytes",
        "--idempotency-ttl",
        "--history-retention-days",
        "--http-body-timeout",
        "--max-connections",
        "--run-memory-mib",
        "--run-disk-mib",
        "--dataset-quota-bytes",
    ):
        assert option in text
    assert "default 50GiB" in text
