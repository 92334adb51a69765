"""What the sidebar polls (`GET /v1/capacity`'s pending jobs, and each waiting job's queue reason) costs
the same few store queries with 10 or 400 jobs waiting: no query, and no walk of the queue, per job."""

from __future__ import annotations

from cortex_backend.auth import Principal
from cortex_backend.devices import detect_devices
from cortex_backend.queue_reasons import QueueReasons
from cortex_backend.scheduler import Scheduler
from cortex_backend.store import Store


def queue_of(tmp_path, waiting: int) -> tuple[Store, Scheduler]:
    """One job on the only slot and `waiting` jobs behind it, of two owners."""
    store = Store(tmp_path / f"queue-{waiting}.sqlite3")
    scheduler = Scheduler(detect_devices("cpu:1", 1))
    for index in range(waiting + 1):
        job_id = f"job-{index:04d}"
        owner = "alice" if index % 2 else "bob"
        store.insert_job(
            {"id": job_id, "owner": owner, "name": f"run {index}", "status": "pending", "spec": {}},
            [{"id": "training-0", "type": "training", "status": "pending", "spec": {"base_model": "tiny"}}],
        )
        scheduler.enqueue(job_id, 1)
        if index == 0:
            assert scheduler.admit()
    return store, scheduler


def statements(store: Store, action) -> int:
    seen: list[str] = []
    connections = {id(conn): conn for conn in vars(store).values() if hasattr(conn, "set_trace_callback")}
    for conn in connections.values():
        conn.set_trace_callback(seen.append)
    try:
        action()
    finally:
        for conn in connections.values():
            conn.set_trace_callback(None)
    return len(seen)


def test_pending_jobs_and_queue_reasons_cost_the_same_queries_with_10_or_400_waiting(tmp_path):
    alice = Principal("t1", "alice", frozenset({"jobs:read"}))
    costs = {}
    for waiting in (10, 400):
        store, scheduler = queue_of(tmp_path, waiting)
        reasons = QueueReasons(store, scheduler, lambda holder: None)
        rows: list[dict] = []
        costs[waiting] = statements(store, lambda r=reasons, out=rows: out.extend(r.pending_jobs(alice)))
        # Right, too: alice sees her own waiting jobs, in queue order, and is not told whose job runs.
        assert [row["job_id"] for row in rows] == [f"job-{i:04d}" for i in range(1, waiting + 1) if i % 2]
        assert [row["position"] for row in rows] == list(range(1, waiting + 1, 2))
        last = rows[-1]
        assert last["reason"].startswith(
            f"{last['position'] - 1} ahead in the queue; waiting for a cpu slot: 1/1 held by"
        )
        assert "1 of another user" in last["reason"] and "job-0000" not in last["reason"]
        # A job listing renders each waiting job's reason: after the first, no query at all.
        job_ids = [f"job-{i:04d}" for i in range(1, waiting + 1)]
        costs[f"list-{waiting}"] = statements(
            store, lambda r=reasons, ids=job_ids: [r.for_job(j, alice) for j in ids]
        )
        store.close()
    assert costs[400] <= costs[10] + 1, costs
    assert costs["list-400"] <= costs["list-10"] + 1, costs
