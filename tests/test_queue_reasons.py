"""Five `%%cortex train` cells on a 4-slot backend: the fifth waits, saying why and where in the queue,
and starts as soon as any earlier run finishes, because a finished run frees its device."""

from __future__ import annotations

import os

import pytest

from cortex_nb import Client
from cortex_nb.widgets import job_widget

from .backend_process import start_backend
from .notebook_fixtures import run_cell, train_spec, wait_until


@pytest.fixture
def four_slot_shell(cortex_shell, tmp_path):
    """The notebook shell, connected for one test to a backend of its own with 4 CPU slots."""
    backend = start_backend(
        tmp_path / "backend", "--devices", "cpu:4", "--worker-threads", "1", "--warm-workers", "0"
    )
    magics = cortex_shell.magics_manager.registry["CortexMagics"]
    previous = magics.connection
    os.environ["CORTEX_FOUR_SLOT_TOKEN"] = backend.token
    try:
        connected = run_cell(
            cortex_shell, f"%cortex connect {backend.url} --token-env CORTEX_FOUR_SLOT_TOKEN"
        )
        assert connected.success, connected.stderr
        yield cortex_shell, backend
    finally:
        del os.environ["CORTEX_FOUR_SLOT_TOKEN"]
        magics.connection = previous
        backend.stop()


def test_the_fifth_run_says_why_it_waits_and_starts_when_a_run_finishes(four_slot_shell):
    shell, backend = four_slot_shell
    client = Client(backend.url, backend.token)
    # q0 is short (80 small steps); q1..q3 train far longer than this test runs.
    short = (
        train_spec(80).replace("batch_size: 4", "batch_size: 1").replace("max_seq_len: 64", "max_seq_len: 16")
    )
    for index, spec in enumerate((short, train_spec(5000), train_spec(5000), train_spec(5000))):
        ran = run_cell(shell, f"%%cortex train --name q{index} -o q{index}\n" + spec)
        assert ran.success, ran.stderr
    holders = [shell.user_ns[f"q{index}"] for index in range(4)]
    ran = run_cell(shell, "%%cortex train --name q4 -o q4\n" + train_spec(20))
    assert ran.success, ran.stderr
    fifth = shell.user_ns["q4"]
    waiting = fifth.refresh()
    assert waiting["status"] == "pending"
    queue = waiting["queue"]
    assert queue["position"] == 1 and set(queue["blocked_by"]) == {job.job_id for job in holders}
    assert queue["reason"] == "waiting for a cpu slot: 4/4 held by jobs q0, q1, q2, q3"
    # Its widget says so in one word and a detail; %cortex status lists it.
    state = job_widget._WIDGETS[fifth.job_id].state
    wait_until(lambda: state.snapshot().status == "queued" and state.snapshot().detail, 30)
    assert state.snapshot().detail.startswith(
        "#1 in the queue: waiting for a cpu slot: 4/4 held by jobs q0, q1, q2, q3"
    )
    status = run_cell(shell, "%cortex status")
    assert (
        f"queued #1: q4 ({fifth.job_id}): waiting for a cpu slot: 4/4 held by jobs q0, q1, q2, q3"
        in status.stdout
    )
    # Once every holder trains, each has an ETA: the wait has an estimate, the short run's, not the others'.
    wait_until(lambda: all((job.progress or {}).get("eta_s") is not None for job in holders), 300)
    # (Read again for a moment: the backend reuses a holder's reading for a second.)
    wait_until(lambda: (fifth.refresh()["queue"] or {}).get("estimate_s") is not None, 10)
    estimate = fifth.info["queue"]["estimate_s"]
    assert estimate < min(job.progress["eta_s"] for job in holders[1:])

    # q0 finishes; its job completes, freeing its slot, and the fifth starts while q1..q3 still train.
    wait_until(lambda: fifth.refresh()["status"] != "pending", 300)
    q0 = client.get_job(holders[0].job_id)
    assert q0["status"] == "done" and q0["progress"]["step"] == 80
    assert fifth.info["started_at"] >= q0["finished_at"]
    assert all(client.get_job(job.job_id)["status"] == "running" for job in holders[1:])
    assert fifth.info["queue"] is None
    for job in (*holders[1:], fifth):
        job.cancel()
