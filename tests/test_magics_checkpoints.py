"""Checkpoints from the notebook front: `save: {every}` in the train spec, `%cortex checkpoints`, the
widget's Save button, and Ctrl-C naming the checkpoint to resume from."""

from __future__ import annotations

import os
import signal
import threading

from cortex_nb import Client
from cortex_nb.train_loop import live_run
from cortex_nb.widgets import job_widget

from .notebook_fixtures import run_cell, train_spec, wait_until


def test_save_every_n_steps_lists_checkpoints_and_the_button_saves_one_more(cortex_shell, backend):
    ran = run_cell(cortex_shell, "%%cortex train --wait -o saving_job\n" + train_spec(12, save="{every: 5}"))
    assert ran.success, ran.stderr
    job = cortex_shell.user_ns["saving_job"]
    try:
        run = live_run(job.job_id)
        assert run.status == "done" and run.last_checkpoint == "step-12"
        assert list(run.state.snapshot().checkpoints) == ["step-5", "step-10", "step-12"]
        table = run_cell(cortex_shell, f"%cortex checkpoints {job.job_id}").result
        assert list(table["checkpoint_id"]) == ["step-5", "step-10", "step-12"]
        assert list(table["step"]) == [5, 10, 12] and set(table["type"]) == {"resumable"}
        widget = job_widget._WIDGETS[job.job_id]
        widget.throttle.flush()
        assert "checkpoint step-12" in widget.stats.value
        assert widget.save_button in widget.children[-1].children

        # One more step outside the loop, then the button saves it under the backend's default name.
        job.forward_backward(_one_batch(job)).result()
        job.step().result()
        widget.save_button.click()
        with Client(backend.url, backend.token) as client:
            wait_until(lambda: [c["checkpoint_id"] for c in client.list_checkpoints(job.job_id)][-1:] == ["step-13"], 60)
        wait_until(lambda: widget.state.snapshot().checkpoints[-1] == "step-13", 30)
        assert not widget.action_errors
    finally:
        job.cancel()


def _one_batch(job):
    from cortex_nb.batching import next_token_batch

    return next_token_batch(job.client.tokenize("tiny", ["The lamp is lit."]))


def test_ctrl_c_names_the_last_checkpoint_to_resume_from(cortex_shell, backend):
    from cortex_nb import train_loop

    before = set(train_loop._RUNS)
    stop_watching = threading.Event()

    def press_ctrl_c_after_a_checkpoint() -> None:
        while not stop_watching.wait(0.05):
            runs = [run for job_id, run in list(train_loop._RUNS.items()) if job_id not in before]
            if runs and runs[0].last_checkpoint:
                os.kill(os.getpid(), signal.SIGINT)
                return

    watcher = threading.Thread(target=press_ctrl_c_after_a_checkpoint, daemon=True)
    watcher.start()
    try:
        ran = run_cell(cortex_shell, "%%cortex train --wait -o resumable_job\n" + train_spec(2000, save="{every: 3}"))
    finally:
        stop_watching.set()
    assert ran.success, ran.stderr
    job = cortex_shell.user_ns["resumable_job"]
    try:
        run = live_run(job.job_id)
        assert run.status == "stopped" and run.last_checkpoint and run.last_checkpoint.startswith("step-")
        note = ran.stdout.strip().splitlines()[-1]
        assert note.startswith(f"interrupted: stopped {job.job_id} at step ")
        assert f"last checkpoint {run.last_checkpoint!r}: resume with .load({run.last_checkpoint!r})" in note
        with Client(backend.url, backend.token) as client:
            assert run.last_checkpoint in {c["checkpoint_id"] for c in client.list_checkpoints(job.job_id)}
    finally:
        job.cancel()
