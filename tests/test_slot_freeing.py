"""A cancelled job's device slot is free only once its worker process has exited: the next job never
starts beside a worker that still holds the device's memory, and meanwhile the queue says "freeing"."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from cortex_nb import Client

from .backend_process import start_backend
from .notebook_fixtures import wait_until
from .training_data import random_batches

TINY_VOCAB = 259


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_next_job_starts_only_after_the_cancelled_jobs_worker_exited(tmp_path):
    backend = start_backend(
        tmp_path / "freeing",
        "--devices",
        "cpu:1",
        "--sub-jobs-per-device",
        "1",
        "--warm-workers",
        "0",
        "--worker-threads",
        "1",
    )
    client = Client(backend.url, backend.token)
    headers = {"Authorization": f"Bearer {backend.token}"}
    try:
        busy = client.create_training_job("tiny", wait=False, idle_timeout_s=0)
        busy.wait_ready()
        pid = client.get_job(busy.job_id)["sub_jobs"][0]["info"]["pid"]
        # Work queued in the worker keeps it busy after it is asked to stop (until the stop's grace ends).
        batches = random_batches(40, TINY_VOCAB, rows=8, length=64)
        futures = [busy.forward_backward(batch) for batch in batches]
        first = futures[0].request_id
        wait_until(
            lambda: (
                httpx.get(
                    f"{backend.url}/v1/jobs/{busy.job_id}/requests/{first}", headers=headers, timeout=30
                ).json()["status"]
                != "queued"
            ),
            120,
        )
        waiting = client.create_training_job("tiny", wait=False)
        exited_at: list[float] = []

        def watch() -> None:
            while alive(pid):
                time.sleep(0.002)
            exited_at.append(time.time())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        cancel_at = time.time()
        cancelled = httpx.post(f"{backend.url}/v1/jobs/{busy.job_id}/cancel", headers=headers, timeout=30)
        assert cancelled.json()["status"] == "cancelled"
        reasons = []
        while not exited_at:
            job = httpx.get(f"{backend.url}/v1/jobs/{waiting.job_id}", headers=headers, timeout=30).json()
            if job["status"] != "pending":
                break
            reasons.append(job["queue"]["reason"])
            time.sleep(0.05)
        watcher.join(60)
        assert exited_at, "the cancelled job's worker never exited"
        wait_until(
            lambda: (
                httpx.get(f"{backend.url}/v1/jobs/{waiting.job_id}", headers=headers, timeout=30).json()[
                    "status"
                ]
                != "pending"
            ),
            60,
        )
        started_at = httpx.get(f"{backend.url}/v1/jobs/{waiting.job_id}", headers=headers, timeout=30).json()[
            "started_at"
        ]
        # Admitted after the old worker was gone (the watcher sees the exit within a few ms of it).
        assert started_at >= exited_at[0] - 0.25, (started_at, exited_at[0])
        assert any("freeing" in reason for reason in reasons), reasons
        print(
            f"worker exited {exited_at[0] - cancel_at:.2f} s after the cancel; next job admitted"
            f" {started_at - exited_at[0]:+.3f} s after the exit"
        )
    finally:
        client.close()
        backend.stop()
