"""One local backend per user that outlives kernels: two real kernels share it, a kernel restart stops
nothing and `%cortex job ID` reattaches to the live run; it exits by itself when idle; and when it dies,
views say "backend gone" and `%cortex connect --local` brings a new one that tells how jobs really ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import OrderedDict

from cortex_nb import Client
from cortex_nb.local import find_local_backend, process_exited, wait_for_exit
from cortex_nb.widgets import job_widget

from .kernels import Kernel, kernel_env
from .notebook_fixtures import run_cell, train_spec, wait_until

CONNECT = "%load_ext cortex_nb\n%cortex connect --local"


def test_kernel_restarts_leave_the_local_backend_and_every_notebooks_runs_alive(tmp_path):
    local = tmp_path / "local"
    kernel = Kernel(kernel_env(local), tmp_path)
    try:
        assert "your local backend in" in kernel.run(CONNECT)
        backend = find_local_backend(local)
        assert backend is not None and backend.started is False  # found through its state file
        kernel.run("%%cortex train -o job --name outlives-restart\n" + train_spec(4000))
        job_id = kernel.run("print(job.job_id)").strip()
        # Another notebook of this user: the same backend, found the same way, with the same token.
        other_notebook = Client(backend.url, backend.token)
        other_id = other_notebook.train(train_spec(4000), name="other-notebook").job_id
        assert {job_id, other_id} <= {job["job_id"] for job in other_notebook.list_jobs(limit=10)}
        wait_until(lambda: (other_notebook.get_job(job_id)["progress"] or {}).get("step", 0) >= 3, 180)

        kernel.restart()  # the kernel that started the backend

        before = other_notebook.get_job(job_id)["progress"]["step"]
        assert find_local_backend(local).pid == backend.pid and not process_exited(backend.pid)
        kernel.run(CONNECT)
        kernel.run(f"%cortex job {job_id}")
        reattached = kernel.run(
            "import time\nfrom cortex_nb.widgets import job_widget\n"
            f"state = job_widget._WIDGETS[{job_id!r}].state\n"
            "while state.step == 0: time.sleep(0.05)\n"
            "first = state.step\n"
            "while state.step <= first: time.sleep(0.05)\n"
            "print(state.status, first, state.step, state.total_steps)"
        ).split()
        assert reattached[0] == "training" and before <= int(reattached[1]) < int(reattached[2])
        assert reattached[3] == "4000"  # the run's own plan, known to the backend
        for run_id in (job_id, other_id):  # the other notebook's run never noticed
            assert other_notebook.get_job(run_id)["status"] == "running"
        wait_until(lambda: other_notebook.get_job(other_id)["progress"]["step"] > before, 120)
        for run_id in (job_id, other_id):
            other_notebook.cancel_job(run_id)
    finally:
        kernel.shutdown()
        found = find_local_backend(local)
        if found is not None:
            found.stop()


def test_two_starts_at_once_make_one_local_backend_that_exits_when_idle(tmp_path):
    # Each racer starts (or finds) the backend and gives it a job at once, before its 3 s idle exit.
    code = (
        "from cortex_nb import Client; from cortex_nb.local import ensure_local_backend;"
        f" backend = ensure_local_backend({str(tmp_path)!r}, warm_workers=0, idle_exit_s=3);"
        " job = Client(backend.url, backend.token).create_training_job('tiny', wait=False);"
        " print(backend.pid, job.job_id)"
    )
    racers = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    answers = [racer.communicate(timeout=180)[0].split() for racer in racers]
    pids = {int(pid) for pid, _ in answers}
    assert len(pids) == 1, pids  # the lock let one start it; the other found it
    pid = pids.pop()
    backend = find_local_backend(tmp_path)
    assert backend is not None and backend.pid == pid
    assert not wait_for_exit(pid, 5.0)  # jobs (starting, then running) keep it up past its idle exit
    client = Client(backend.url, backend.token)
    for _, job_id in answers:
        client.complete_job(job_id)
    assert wait_for_exit(pid, 60.0), "the local backend did not exit after its idle period"
    assert not (tmp_path / "backend.json").exists()


def test_a_dead_local_backend_says_backend_gone_and_connect_local_brings_a_new_one(
    cortex_shell, tmp_path, monkeypatch
):
    from cortex_nb.job_feed import JobFeed

    monkeypatch.setattr(JobFeed, "MAX_FAILURES", 3)
    magics = cortex_shell.magics_manager.registry["CortexMagics"]
    previous = magics.connection
    connect = f"%cortex connect --local --data-dir {tmp_path}"
    try:
        assert run_cell(cortex_shell, connect).success
        first = find_local_backend(tmp_path)
        kept = run_cell(
            cortex_shell, "%%cortex train --wait -o kept --name trained\n" + train_spec(5, keep_alive="10m")
        )
        assert kept.success, kept.stderr
        kept_job = cortex_shell.user_ns["kept"]
        # `resume: never`: this run fails at the restart, as a client-driven job does (the default, resuming
        # it, is tests/test_surviving_restarts.py's).
        midway = run_cell(
            cortex_shell, "%%cortex train -o midway --name in-flight\n" + train_spec(4000, resume="never")
        )
        assert midway.success, midway.stderr
        midway_job = cortex_shell.user_ns["midway"]
        wait_until(lambda: (midway_job.progress or {}).get("step", 0) >= 1, 180)
        widget = job_widget._WIDGETS[midway_job.job_id]
        magics.connection.client.transport.retry.max_attempts = (
            1  # fail fast: this test is about what follows
        )

        os.killpg(first.pid, signal.SIGKILL)  # the backend dies without any cleanup
        wait_for_exit(first.pid, 30)

        gone = run_cell(cortex_shell, "%cortex jobs")
        assert not gone.success and len(gone.error_lines) == 1
        assert gone.error_lines[0].startswith(
            "UsageError: cortex jobs: backend gone: could not reach the backend"
        )
        assert gone.error_lines[0].endswith(
            "%cortex connect --local starts a new local backend (its jobs are marked as they really ended)"
        )
        wait_until(lambda: widget.state.backend_gone, 60)
        assert widget.state.message.startswith("backend gone: ")

        monkeypatch.setattr(job_widget, "_WIDGETS", OrderedDict())
        assert run_cell(cortex_shell, connect).success
        second = find_local_backend(tmp_path)
        assert second is not None and second.pid != first.pid
        jobs = run_cell(cortex_shell, "%cortex jobs").result.set_index("job_id")
        # Training had ended for the kept-alive run: it is done. The other was in flight: it failed, saying why.
        assert jobs.loc[kept_job.job_id, "status"] == "done"
        assert jobs.loc[midway_job.job_id, "status"] == "failed"
        assert jobs.loc[midway_job.job_id, "failure_code"] == "backend_restarted"
        assert jobs.loc[kept_job.job_id, "step"] == 5
        assert kept_job.client is not magics.connection.client  # the old connection's client: use the new one
        phases = {
            job_id: magics.connection.client.get_job(job_id)["progress"]["phase"]
            for job_id in (kept_job.job_id, midway_job.job_id)
        }
        assert phases == {kept_job.job_id: "finished", midway_job.job_id: "failed"}
    finally:
        magics.connection = previous
        found = find_local_backend(tmp_path)
        if found is not None:
            found.stop()
