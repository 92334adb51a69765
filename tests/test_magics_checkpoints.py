"""Checkpoints of training runs from the notebook front: `save: {every}` in the train spec, `final` at the
end, `%cortex checkpoints`, the widget's Save button. ("Free device" saving `final`: test_managed_training.py.)"""

from __future__ import annotations

from cortex_nb import Client
from cortex_nb.widgets import job_widget

from .notebook_fixtures import run_cell, train_spec, wait_until


def test_save_every_n_steps_lists_checkpoints_and_the_button_saves_one_more(cortex_shell, backend):
    ran = run_cell(
        cortex_shell,
        "%%cortex train --wait -o saving_job\n" + train_spec(12, save="{every: 5}", keep_alive="10m"),
    )
    assert ran.success, ran.stderr
    job = cortex_shell.user_ns["saving_job"]
    try:
        assert job.progress["last_checkpoint"] == "final"
        table = run_cell(cortex_shell, f"%cortex checkpoints {job.job_id}").result
        assert list(table["checkpoint_id"]) == ["step-5", "step-10", "final"]
        assert list(table["step"]) == [5, 10, 12] and set(table["type"]) == {"resumable"}
        widget = job_widget._WIDGETS[job.job_id]
        widget.throttle.flush()
        assert "checkpoint final" in widget.stats.value
        assert widget.save_button in widget.children[-1].children

        # One more step outside the loop (the job keeps alive for this), then the button saves it under
        # the backend's default name.
        job.forward_backward(_one_batch(job)).result()
        job.step().result()
        widget.save_button.click()
        with Client(backend.url, backend.token) as client:
            wait_until(
                lambda: [c["checkpoint_id"] for c in client.list_checkpoints(job.job_id)][-1:] == ["step-13"],
                60,
            )
        wait_until(lambda: widget.state.snapshot().checkpoints[-1] == "step-13", 30)
        assert not widget.action_errors
    finally:
        job.cancel()


def _one_batch(job):
    from cortex_nb.batching import next_token_batch

    return next_token_batch(job.client.tokenize("tiny", ["The lamp is lit."]))
