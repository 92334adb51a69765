"""A store that refuses writes, through real processes: a data dir on a small tmpfs filled mid-run, and
another process holding the SQLite lock. Running jobs neither freeze nor take the backend down with them:
a job fails with `storage_unavailable` (keeping what was recorded) and frees its slot, a full disk answers
507, a refused save gives its checkpoint id back, and everything works again once space returns."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from cortex_backend.checkpoints import CheckpointManager
from cortex_backend.store import Store

from cortex_nb import Client
from cortex_nb.demo_data import addition_problems
from cortex_nb.protocol.checkpoint_format import MANIFEST
from cortex_nb.protocol.schemas.data_plane import SaveBody

from .backend_process import start_backend
from .notebook_fixtures import wait_until
from .training_data import random_batches

TINY_VOCAB = 259
MANAGED = {
    "base_model": "tiny",
    "steps": 100_000,
    "batch_size": 8,
    "max_seq_len": 16,
    "optimizer": {"lr": 0.003},
    "lora": {"r": 8, "alpha": 16},
    "seed": 3,
}


@pytest.fixture
def small_disk(tmp_path):
    """A 96 MiB tmpfs to serve as a backend's data dir."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m,mode=0700", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, name: str) -> None:
    """Fill the disk: a file up to the last few hundred KiB, then the store's own write-ahead log until
    SQLite says it is full (so that the backend's next write needs space, whatever its log held)."""
    left = shutil.disk_usage(disk).free - (384 << 10)
    with open(disk / name, "wb") as filler:
        try:
            while left > 0:
                filler.write(b"\0" * min(left, 1 << 20))
                left -= 1 << 20
            filler.flush()
        except OSError:
            pass
    store = sqlite3.connect(disk / "cortex.sqlite3", timeout=10, isolation_level=None)
    try:
        store.execute("CREATE TABLE IF NOT EXISTS test_filler (data BLOB)")
        # Large rows, then ever smaller ones: a refused transaction leaves the log room for smaller writes.
        for size in (32768, 4096, 256, 0):
            try:
                for _ in range(2000):
                    store.execute("INSERT INTO test_filler VALUES (zeroblob(?))", (size,))
            except sqlite3.OperationalError as exc:
                assert "full" in str(exc), exc
            else:
                raise AssertionError("the disk never filled")
    finally:
        store.close()


def job_of(backend, job_id: str) -> dict:
    response = httpx.get(
        f"{backend.url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {backend.token}"}, timeout=30
    )
    assert response.status_code == 200, response.text
    return response.json()


def log_lines(backend, job_id: str) -> list[dict]:
    response = httpx.get(
        f"{backend.url}/v1/jobs/{job_id}/logs",
        headers={"Authorization": f"Bearer {backend.token}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()["lines"]


def slots_in_use(backend) -> int:
    response = httpx.get(
        f"{backend.url}/v1/capacity", headers={"Authorization": f"Bearer {backend.token}"}, timeout=30
    )
    return response.json()["slots_in_use"]


def save(backend, job_id: str, checkpoint_id: str) -> httpx.Response:
    return httpx.post(
        f"{backend.url}/v1/jobs/{job_id}/save",
        json={"checkpoint_id": checkpoint_id},
        headers={"Authorization": f"Bearer {backend.token}"},
        timeout=60,
    )


def job_latencies(backend, job_id: str, seconds: float) -> list[float]:
    """GET /v1/jobs/{id}, every 0.1 s for `seconds`: each answer's round-trip time (each a running job)."""
    latencies, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        response = httpx.get(
            f"{backend.url}/v1/jobs/{job_id}",
            headers={"Authorization": f"Bearer {backend.token}"},
            timeout=30,
        )
        latencies.append(time.monotonic() - started)
        assert response.status_code == 200 and response.json()["status"] == "running"
        time.sleep(0.1)
    return latencies


def request_outcome(backend, job_id: str, request_id: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        request = httpx.get(
            f"{backend.url}/v1/jobs/{job_id}/requests/{request_id}",
            headers={"Authorization": f"Bearer {backend.token}"},
            timeout=30,
        ).json()
        if request["status"] in ("succeeded", "failed", "cancelled"):
            return request
        time.sleep(0.1)
    raise AssertionError(f"request {request_id} did not end")


def test_a_full_disk_fails_the_running_job_frees_its_slot_answers_507_and_space_coming_back_heals(small_disk):
    backend = start_backend(
        small_disk,
        "--devices",
        "cpu:2",
        "--warm-workers",
        "0",
        "--worker-threads",
        "1",
        "--storage-retry",
        "3",
        prefix=["env"],  # the backend's own log outside the small disk
    )
    client = Client(backend.url, backend.token)
    headers = {"Authorization": f"Bearer {backend.token}"}
    try:
        managed = client.train({**MANAGED, "data": addition_problems()}, name="fills-the-disk")
        wait_until(lambda: (managed.progress or {}).get("step", 0) >= 2, 180)
        fill(small_disk, "filler-1")
        full_at = time.monotonic()
        # The job fails, with its code, in a bounded time (retried for 3 s first), and its slot is freed.
        wait_until(lambda: job_of(backend, managed.job_id)["status"] != "running", 120, 0.1)
        failed_after = time.monotonic() - full_at
        failed = job_of(backend, managed.job_id)
        assert failed["status"] == "failed" and failed["failure_code"] == "storage_unavailable", failed
        assert "could not record" in failed["failure_message"]
        # What was recorded before is kept.
        assert failed["progress"]["step"] >= 2
        assert log_lines(backend, managed.job_id)
        wait_until(lambda: slots_in_use(backend) == 0, 60, 0.1)
        freed_after = time.monotonic() - full_at

        # A job that sits idle while the disk fills again: refused writes answer 507, keeping nothing.
        idle = client.create_training_job("tiny", wait=False, idle_timeout_s=0)
        idle.wait_ready()
        fill(small_disk, "filler-2")
        created = httpx.post(
            f"{backend.url}/v1/jobs",
            json={"sub_jobs": [{"type": "training", "base_model": "tiny"}]},
            headers=headers,
            timeout=60,
        )
        assert created.status_code == 507 and created.json()["error"]["code"] == "insufficient_storage"
        dataset = "\n".join(f'{{"prompt": "{i}+{i}=", "completion": "{2 * i}"}}' for i in range(40_000))
        body = dataset.encode()
        uploaded = httpx.put(
            f"{backend.url}/v1/datasets/{hashlib.sha256(body).hexdigest()}",
            content=body,
            headers=headers,
            timeout=60,
        )
        assert uploaded.status_code == 507, uploaded.text
        assert uploaded.json()["error"]["code"] == "insufficient_storage"
        assert not list(small_disk.glob("datasets/*/.*.partial"))
        refused = save(backend, idle.job_id, "kept-id")
        assert refused.status_code == 507 and refused.json()["error"]["code"] == "insufficient_storage"

        # Space returns: the same checkpoint id is free, the idle job trains, a new job runs.
        for name in ("filler-1", "filler-2"):
            (small_disk / name).unlink()
        back_at = time.monotonic()
        again = save(backend, idle.job_id, "kept-id")
        assert again.status_code == 202, again.text
        assert request_outcome(backend, idle.job_id, again.json()["request_id"])["status"] == "succeeded"
        fresh = client.create_training_job("tiny", wait=False)
        fresh.wait_ready()
        loss = fresh.forward_backward(random_batches(1, TINY_VOCAB)[0]).result(timeout_s=120)["loss"]
        assert loss > 0
        recovered_after = time.monotonic() - back_at
        print(
            f"disk full -> job failed (storage_unavailable) in {failed_after:.2f} s (retry window 3 s),"
            f" slot freed in {freed_after:.2f} s; space back -> save + new job's first step in"
            f" {recovered_after:.2f} s"
        )
        assert backend.healthy()
    finally:
        client.close()
        backend.stop()


HOLD_LOCK = textwrap.dedent("""
    import sqlite3, sys, time
    store = sqlite3.connect(sys.argv[1], isolation_level=None)
    store.execute("BEGIN EXCLUSIVE")
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    store.execute("COMMIT")
""")


def test_a_held_database_lock_leaves_the_backend_answering_and_the_running_job_going(tmp_path):
    backend = start_backend(
        tmp_path / "locked",
        "--devices",
        "cpu:2",
        "--warm-workers",
        "0",
        "--worker-threads",
        "1",
    )
    client = Client(backend.url, backend.token)
    try:
        managed = client.train({**MANAGED, "data": addition_problems()}, name="trains-through-a-lock")
        idle = client.create_training_job("tiny", wait=False, idle_timeout_s=0)
        idle.wait_ready()
        wait_until(lambda: (managed.progress or {}).get("step", 0) >= 2, 180)
        idle_latencies = job_latencies(backend, managed.job_id, 2.0)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_LOCK, str(tmp_path / "locked" / "cortex.sqlite3"), "7"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout.readline().strip() == "held"
        held_at = time.monotonic()
        # Reads answer while the lock is held; a save refused meanwhile says so (503) and keeps nothing.
        refused = save(backend, idle.job_id, "during-lock")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "storage_unavailable"
        latencies = job_latencies(backend, managed.job_id, 6 - (time.monotonic() - held_at))
        assert holder.wait(30) == 0
        step_at_release = job_of(backend, managed.job_id)["progress"]["step"]
        # The refused save's id is free, and the job keeps training past the lock.
        again = save(backend, idle.job_id, "during-lock")
        assert again.status_code == 202, again.text
        assert request_outcome(backend, idle.job_id, again.json()["request_id"])["status"] == "succeeded"
        wait_until(
            lambda: job_of(backend, managed.job_id)["progress"]["step"] > step_at_release + 2, 120, 0.2
        )
        assert job_of(backend, managed.job_id)["status"] == "running"
        lines = log_lines(backend, managed.job_id)
        assert lines
        for name, values in (("idle", idle_latencies), ("while another process held the lock", latencies)):
            print(
                f"GET /v1/jobs/{{id}} {name}: n={len(values)} max={max(values) * 1000:.0f} ms"
                f" median={statistics.median(values) * 1000:.0f} ms"
            )
    finally:
        client.close()
        backend.stop()


def test_partial_dataset_files_count_in_the_quota_and_are_removed_at_start(tmp_path):
    data_dir = tmp_path / "partials"
    args = ("--devices", "cpu:1", "--warm-workers", "0", "--dataset-quota-bytes", "200000")
    backend = start_backend(data_dir, *args)
    headers = {"Authorization": f"Bearer {backend.token}"}
    body = "\n".join(f'{{"prompt": "{i}+{i}=", "completion": "{2 * i}"}}' for i in range(2000)).encode()
    path = f"/v1/datasets/{hashlib.sha256(body).hexdigest()}"
    try:
        owner = httpx.get(f"{backend.url}/v1/whoami", headers=headers, timeout=30).json()["owner"]
        folder = data_dir / "datasets" / owner.encode().hex()
        folder.mkdir(parents=True, exist_ok=True)
        orphan = folder / f".{'0' * 64}.jsonl.dead.partial"
        orphan.write_bytes(b"x" * 150_000)  # what an upload cut short by a full disk or a crash leaves
        refused = httpx.put(backend.url + path, content=body, headers=headers, timeout=60)
        assert refused.status_code == 413 and refused.json()["error"]["code"] == "quota_exceeded", (
            refused.text
        )
    finally:
        backend.stop()
    backend = start_backend(data_dir, *args)
    try:
        assert not orphan.exists()
        stored = httpx.put(
            backend.url + path, content=body, headers={"Authorization": f"Bearer {backend.token}"}, timeout=60
        )
        assert stored.status_code == 200, stored.text
    finally:
        backend.stop()


def test_a_save_whose_record_the_store_refuses_is_committed_whole_when_retried(tmp_path):
    """The store refuses a finished save's record (another process holds the lock): its files go back where
    they were and its reservation is kept, so the retry records the same files under the same id, once."""
    store = Store(tmp_path / "cortex.sqlite3", busy_timeout_ms=50)
    manager = CheckpointManager(store, tmp_path / "checkpoints", quota_bytes=None)
    job = {"id": "job-1", "owner": "alice"}
    plan = manager.prepare_save(
        "req-1", job, {"id": "training-0", "info": {}}, SaveBody(checkpoint_id="mine")
    )
    directory = Path(plan["directory"])
    directory.mkdir()
    (directory / "adapter.bin").write_bytes(b"w" * 100)
    manifest = {"step": 7, "files": {"adapter.bin": {"size": 100}}, "adapter": {"base_model": "tiny"}}
    (directory / MANIFEST).write_text(json.dumps(manifest))
    holder = sqlite3.connect(tmp_path / "cortex.sqlite3", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sqlite3.OperationalError):
            manager.commit_save("req-1", {"manifest": manifest})
        assert directory.is_dir() and not (directory.parent / "mine").exists()
    finally:
        holder.execute("COMMIT")
        holder.close()
    checkpoint = manager.commit_save("req-1", {"manifest": manifest})
    assert checkpoint["checkpoint_id"] == "mine" and checkpoint["step"] == 7
    assert [row["id"] for row in store.list_checkpoints("job-1")] == ["mine"]
    assert sorted(path.name for path in directory.parent.iterdir()) == ["mine"]
    store.close()
