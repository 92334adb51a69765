"""The live job widget against the real backend: Cancel from the button, bounded data on long runs."""

from __future__ import annotations

import time

import pytest

from cortex_nb import Client
from cortex_nb.widgets import job_widget, state
from cortex_nb.widgets.throttle import MAX_RENDERS_PER_S, RenderThrottle

from .notebook_fixtures import run_cell, train_spec, wait_until


def test_cancel_button_cancels_the_job_on_the_backend(cortex_shell, backend):
    ran = run_cell(cortex_shell, "%%cortex train -o button_job\n" + train_spec(2000))
    assert ran.success, ran.stderr
    job = cortex_shell.user_ns["button_job"]
    widget = job_widget._WIDGETS[job.job_id]
    wait_until(lambda: widget.state.step >= 3, 120)
    assert not widget.state.finished

    widget.cancel_button.click()  # what a click in the browser calls

    with Client(backend.url, backend.token) as client:
        wait_until(lambda: client.get_job(job.job_id)["status"] == "cancelled", 30)
    wait_until(lambda: widget.state.finished, 30)
    assert widget.state.status == "cancelled" and widget.state.step < 2000
    widget.throttle.flush()
    wait_until(lambda: widget.cancel_button.disabled and "cancelled" in repr(widget), 10)
    assert widget.progress.bar_style == "warning"
    assert not widget.action_errors
    assert f'data-cortex-open-job="{job.job_id}"' in widget.open_in_sidebar.value


@pytest.mark.slow
def test_a_2000_step_run_keeps_the_widget_data_bounded(cortex_shell, backend):
    body = train_spec(2000).replace("batch_size: 4", "batch_size: 1").replace("max_seq_len: 64", "max_seq_len: 8")
    started = time.monotonic()
    ran = run_cell(cortex_shell, "%%cortex train --wait -o long_job\n" + body)
    elapsed = time.monotonic() - started
    assert ran.success, ran.stderr
    job = cortex_shell.user_ns["long_job"]
    widget = job_widget._WIDGETS[job.job_id]
    snap = widget.state.snapshot()
    assert snap.status == "done" and snap.step == 2000
    # The backend logged a line per step; the widget kept only its tail.
    wait_until(lambda: widget.feed.log_cursor >= 2000, 30)
    sizes = widget.state.retained_sizes()
    assert sizes["loss_points"] <= state.CHART_POINTS
    assert sizes["log_lines"] == state.LOG_TAIL_LINES
    assert sizes["metric_points"] <= 2 * state.METRIC_POINTS
    widget.throttle.flush()
    assert snap.loss[0][0] == 1 and snap.loss[-1][0] > 1990  # the whole run is still on the chart
    assert len(widget.loss_chart.value) < 12_000 and len(widget.logs.value) < 20_000
    # Batched updates: never more than 4 renders a second over the run.
    assert widget.throttle.renders <= MAX_RENDERS_PER_S * elapsed + 2
    assert widget.progress.value == 2000


def test_render_throttle_batches_bursts_to_four_a_second():
    rendered: list[int] = []
    counter = {"value": 0}
    throttle = RenderThrottle(lambda: rendered.append(counter["value"]), lambda: counter["value"] >= 3000)
    started = time.monotonic()
    while counter["value"] < 3000:
        counter["value"] += 1
        throttle.mark_dirty()
        time.sleep(0.0005)
    throttle.flush()
    elapsed = time.monotonic() - started
    assert rendered[-1] == 3000  # the last change is always drawn
    assert len(rendered) <= MAX_RENDERS_PER_S * elapsed + 2
    times = list(throttle.render_times)
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert min(gaps) >= 1 / MAX_RENDERS_PER_S - 0.01


def test_open_in_sidebar_is_an_element_the_lab_extension_can_find():
    html = job_widget.open_in_sidebar_html("job-abc123")
    assert 'class="cortex-open-in-sidebar' in html and 'data-cortex-open-job="job-abc123"' in html
    quoted = job_widget.open_in_sidebar_html('job-"x"')
    assert 'data-cortex-open-job="job-&quot;x&quot;"' in quoted


def test_a_widget_whose_backend_dies_stops_following_without_hanging(tmp_path, monkeypatch, cortex_shell):
    from cortex_nb import RetryPolicy
    from cortex_nb.job_feed import JobFeed

    from .backend_process import start_backend

    monkeypatch.setattr(JobFeed, "MAX_FAILURES", 2)
    own = start_backend(tmp_path / "backend", "--devices", "cpu:1")
    try:
        client = Client(own.url, own.token, retry=RetryPolicy(max_attempts=1))
        job = client.create_training_job("tiny")
        widget = job_widget.show_job(client, job.job_id)
        wait_until(lambda: widget.feed.rounds >= 1 and widget.state.job_status == "running", 30)
    finally:
        own.kill()
    widget.feed.join(60)
    assert not widget.feed.alive
    assert widget.state.message.startswith("stopped following:")
    assert any(line.startswith("[cortex] lost touch with the backend") for line in widget.state.log_tail)
