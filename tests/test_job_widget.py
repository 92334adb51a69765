"""The live job widget against the real backend: Cancel from the button, bounded data on long runs."""

from __future__ import annotations

import re
import time
from collections import OrderedDict

import pytest

from cortex_nb import Client
from cortex_nb import job_state as state
from cortex_nb.protocol.states import CELL_DISPLAY_LABEL
from cortex_nb.widgets import job_view, job_widget
from cortex_nb.widgets.throttle import MAX_RENDERS_PER_S, RenderThrottle

from .notebook_fixtures import run_cell, train_spec, wait_until


def test_cancel_asks_before_discarding_trained_steps_then_discards_or_stops_and_saves(cortex_shell, backend):
    """Two runs training side by side: Cancel on each asks first (trained steps, no checkpoint); one is
    cancelled anyway, the other stopped keeping its adapter."""
    widgets = {}
    for name in ("discarded_job", "kept_on_stop_job"):
        ran = run_cell(cortex_shell, f"%%cortex train -o {name}\n" + train_spec(2000))
        assert ran.success, ran.stderr
        widgets[name] = job_widget._WIDGETS[cortex_shell.user_ns[name].job_id]
    wait_until(lambda: all(widget.state.step >= 2 for widget in widgets.values()), 120)
    discarded, kept = widgets["discarded_job"], widgets["kept_on_stop_job"]
    client = Client(backend.url, backend.token)

    discarded.cancel_button.click()  # what a click in the browser calls
    # Trained steps and no checkpoint: the widget asks before throwing them away.
    assert (
        discarded.confirm.layout.display == "flex"
        and "no checkpoint was saved" in discarded.confirm_text.value
    )
    assert client.get_job(discarded.state.job_id)["status"] == "running"
    discarded.keep_button.click()
    assert (
        discarded.confirm.layout.display == "none"
        and client.get_job(discarded.state.job_id)["status"] == "running"
    )
    discarded.cancel_button.click()
    discarded.confirm_button.click()  # "Cancel and discard"

    kept.cancel_button.click()
    assert kept.confirm.layout.display == "flex"
    kept.stop_and_save_button.click()

    wait_until(lambda: client.get_job(discarded.state.job_id)["status"] == "cancelled", 30)
    wait_until(lambda: discarded.state.finished, 30)
    assert discarded.state.status == "cancelled" and discarded.state.step < 2000
    discarded.throttle.flush()
    wait_until(
        lambda: discarded.cancel_button.layout.display == "none" and "cancelled" in repr(discarded), 10
    )
    # A cancel is the user's choice: neutral, never the failure red.
    assert discarded.progress.bar_style == "" and job_view.BADGE_COLORS["cancelled"] == job_view.NEUTRAL
    assert (
        job_view.NEUTRAL in discarded.header.value
        and job_view.BADGE_COLORS["failed"] not in discarded.header.value
    )
    assert f'data-cortex-open-job="{discarded.state.job_id}"' in discarded.open_in_sidebar.value

    wait_until(lambda: client.get_job(kept.state.job_id)["status"] in ("done", "cancelled", "failed"), 60)
    assert client.get_job(kept.state.job_id)["status"] == "done"
    saved = {
        checkpoint["checkpoint_id"]: checkpoint for checkpoint in client.list_checkpoints(kept.state.job_id)
    }
    assert "final" in saved and 2 <= saved["final"]["step"] < 2000
    assert kept.state.message == "device freed; the adapter was saved as checkpoint 'final' first"
    # Stopped and saved before its planned steps: "stopped at N/2000 (checkpoint final)", not "done".
    wait_until(lambda: kept.state.status == "stopped", 30)
    assert not discarded.action_errors and not kept.action_errors
    client.close()


def test_free_device_replaces_cancel_once_training_is_over_and_keeps_the_adapter(cortex_shell, backend):
    ran = run_cell(cortex_shell, "%%cortex train -o kept_job\n" + train_spec(4, keep_alive="10m"))
    assert ran.success, ran.stderr
    job = cortex_shell.user_ns["kept_job"]
    widget = job_widget._WIDGETS[job.job_id]
    wait_until(lambda: widget.state.status == "sampling", 120)  # trained; kept alive for sampling
    widget.throttle.flush()
    wait_until(lambda: widget.free_button.layout.display is None, 10)
    assert widget.cancel_button.layout.display == "none"  # nothing red to click on a trained adapter
    assert re.search(r"keep-alive, freeing the device in (10:00|9:[0-5]\d)", widget.header.value)
    widget.free_button.click()
    with Client(backend.url, backend.token) as client:
        wait_until(lambda: client.get_job(job.job_id)["status"] == "done", 60)
        assert "final" in {checkpoint["checkpoint_id"] for checkpoint in client.list_checkpoints(job.job_id)}
    wait_until(lambda: widget.state.status == "done", 30)
    assert not widget.action_errors
    widget.throttle.flush()
    assert widget.free_button.layout.display == "none" and ">done<" in widget.header.value


@pytest.mark.slow
def test_a_2000_step_run_keeps_the_widget_data_bounded(cortex_shell, backend):
    body = (
        train_spec(2000)
        .replace("batch_size: 4", "batch_size: 1")
        .replace("max_seq_len: 64", "max_seq_len: 8")
    )
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
    assert sizes["metric_points"] <= 4 * state.METRIC_POINTS  # host and job CPU and RAM
    widget.throttle.flush()
    assert snap.loss[0][0] == 1 and snap.loss[-1][0] > 1990  # the whole run is still on the chart
    assert len(widget.loss_chart.value) < 12_000 and len(widget.logs_body.value) < 20_000
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
    html = job_view.open_in_sidebar_html("job-abc123")
    assert 'class="cortex-open-in-sidebar' in html and 'data-cortex-open-job="job-abc123"' in html
    quoted = job_view.open_in_sidebar_html('job-"x"')
    assert 'data-cortex-open-job="job-&quot;x&quot;"' in quoted


def test_a_widget_whose_backend_dies_stops_following_without_hanging(tmp_path, monkeypatch, cortex_shell):
    from cortex_nb import RetryPolicy
    from cortex_nb.job_feed import JobFeed

    from .backend_process import start_backend

    monkeypatch.setattr(JobFeed, "MAX_FAILURES", 2)
    own = start_backend(tmp_path / "backend", "--devices", "cpu:1")
    try:
        # Rides through an absence of 2 s at most (a restart would be back by then), then stops following.
        client = Client(own.url, own.token, retry=RetryPolicy(max_attempts=1), reconnect_s=2)
        job = client.create_training_job("tiny")
        widget = job_widget.show_job(client, job.job_id)
        wait_until(lambda: widget.feed.rounds >= 1 and widget.state.job_status == "running", 30)
    finally:
        own.kill()
    widget.feed.join(60)
    assert not widget.feed.alive
    assert widget.state.message.startswith("stopped following:")
    assert any(line.startswith("[cortex] lost touch with the backend") for line in widget.state.log_tail)


def test_a_run_reattached_after_a_restart_continues_the_first_cells_record(
    cortex_shell, backend, monkeypatch
):
    """The `%%cortex train` cell's record (its display id, recorded with the job) is rewritten by the
    widget that reattaches the run after a kernel restart: "continued in cell N", then the final picture."""
    published: list[dict] = []

    def publish(data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
        published.append({"data": data, "display_id": (transient or {}).get("display_id"), "update": update})

    monkeypatch.setattr(cortex_shell.display_pub, "publish", publish)
    # As in a kernel: a parent message to follow the run in (the plain shell has none).
    monkeypatch.setattr(job_widget, "capture_parent", lambda: {"header": {"msg_id": "train-cell"}})
    ran = run_cell(cortex_shell, "%%cortex train -o continued_job\n" + train_spec(12))
    assert ran.success, ran.stderr
    job_id = cortex_shell.user_ns["continued_job"].job_id
    first = job_widget._WIDGETS[job_id]
    origin = first.origin_display
    assert origin and any(p["display_id"] == origin and not p["update"] for p in published)
    assert Client(backend.url, backend.token).get_job(job_id)["labels"][CELL_DISPLAY_LABEL] == origin

    # The kernel restarts: its widgets and their feeds are gone; the run goes on.
    first.close()
    monkeypatch.setattr(job_widget, "_WIDGETS", OrderedDict())
    before = len(published)
    cell = cortex_shell.execution_count  # the number the next cell runs as
    reattached = run_cell(cortex_shell, f"%cortex job {job_id}")
    assert reattached.success, reattached.stderr
    second = job_widget._WIDGETS[job_id]
    assert second is not first and second.origin_display == origin and second.continued_in == cell
    wait_until(lambda: second.state.finished and not second._live_displays, 120)  # its own cell froze

    updates = [p for p in published[before:] if p["display_id"] == origin]
    assert updates and all(p["update"] for p in updates)  # the first cell's output, rewritten in place
    assert f"continued in cell {cell}:" in updates[0]["data"]["text/html"]
    final = updates[-1]["data"]
    assert f"continued in cell {cell}: after a kernel restart" in final["text/html"]
    assert "its final picture below" in final["text/html"]
    assert ">done</span>" in final["text/html"] and "step 12/12" in final["text/html"]
    assert final["text/plain"].endswith(f"(continued in cell {cell})")
    assert "application/vnd.jupyter.widget-view+json" not in final  # no view left to say "model not found"
    # The reattached cell keeps its own final picture, without the note.
    own = [p for p in published[before:] if p["display_id"] not in (origin, None)]
    assert own and "continued in cell" not in own[-1]["data"]["text/html"]
    assert ">done</span>" in own[-1]["data"]["text/html"]
