"""How the job widget draws and behaves, without a running job: charts, disclosures, the log scale,
relative times, the static picture a saved notebook keeps, and the throttle's timed refresh."""

from __future__ import annotations

import base64
import math
import re
import time
import xml.etree.ElementTree as ElementTree

import pytest

from cortex_nb.job_state import JobState
from cortex_nb.widgets import job_view
from cortex_nb.widgets.job_widget import JobWidget
from cortex_nb.widgets.relative_time import ago
from cortex_nb.widgets.svg import Line, line_chart
from cortex_nb.widgets.throttle import RenderThrottle

from .notebook_fixtures import wait_until

SVG = "{http://www.w3.org/2000/svg}"


def polyline_ys(svg: str) -> list[float]:
    points = ElementTree.fromstring(svg).find(f"{SVG}polyline").get("points").split()
    return [float(point.split(",")[1]) for point in points]


def trained_state(
    steps: int = 30, name: str | None = "lr-3e-3", status: str = "running", **progress
) -> JobState:
    """A job as the backend answers it, its progress record holding `steps` points of loss 8/step."""
    state = JobState("job-render", name, "tiny")
    state.set_job(job_json(steps, name, status, **progress))
    return state


def job_json(steps: int, name: str | None = "lr-3e-3", status: str = "running", **progress) -> dict:
    record = {
        "source": "managed",
        "phase": "training" if status == "running" else "finished",
        "step": steps,
        "total_steps": steps,
        "loss_per_token": 8.0 / steps,
        "summed_loss": 8.0 / steps * 512,
        "history": [{"step": step, "loss_per_token": 8.0 / step} for step in range(1, steps + 1)],
        "eval_history": [],
        "updated_at": time.time(),
        **progress,
    }
    return {
        "job_id": "job-render",
        "status": status,
        "name": name,
        "started_at": time.time() - 125,
        "finished_at": None,
        "progress": record,
        "sub_jobs": [{"type": "training", "base_model": "tiny", "device": "cpu"}],
    }


def test_charts_scale_with_the_cell_and_standalone_ones_have_a_size_and_ink():
    live = line_chart("loss per token", [Line("train", "#000", [(1, 3.0), (2, 2.0)])])
    root = ElementTree.fromstring(live)
    assert root.get("viewBox") == "0 0 360 170" and root.get("width") == "100%" and root.get("height") is None
    assert "height:auto" in root.get("style")
    alone = ElementTree.fromstring(
        line_chart("x", [Line("train", "#000", [(1, 3.0), (2, 2.0)])], standalone=True)
    )
    assert alone.get("width") == "360" and alone.get("height") == "170"
    assert "currentColor" not in ElementTree.tostring(
        alone, encoding="unicode"
    )  # an <img> has no text colour


def test_log_scale_spaces_decades_evenly_and_leaves_out_what_it_cannot_draw():
    points = [(1, 100.0), (2, 10.0), (3, 1.0), (4, 0.1)]
    ys = polyline_ys(line_chart("loss", [Line("train", "#000", points)], log_y=True))
    gaps = [later - earlier for earlier, later in zip(ys, ys[1:], strict=False)]
    assert gaps == pytest.approx([gaps[0]] * 3, abs=0.15)  # each decade is the same height
    linear = polyline_ys(line_chart("loss", [Line("train", "#000", points)]))
    assert linear[2] - linear[1] < gaps[0] / 3  # where a linear axis squashes the tail
    with_zero = line_chart("loss", [Line("train", "#000", [(1, 2.0), (2, 0.0), (3, 1.0)])], log_y=True)
    assert "(1 points ≤ 0 not shown)" in with_zero and len(polyline_ys(with_zero)) == 2


def test_log_scale_toggle_redraws_the_loss_chart(client):
    widget = JobWidget(client, trained_state())
    assert 'aria-label="loss per token"' in widget.loss_chart.value
    linear = polyline_ys(widget.loss_chart.value)
    widget.log_scale.value = True  # what a click on the toggle sets
    widget.throttle.flush()
    assert 'aria-label="loss per token (log scale)"' in widget.loss_chart.value
    logged = polyline_ys(widget.loss_chart.value)

    # 8/step: how far down the curve is at step 15, as a share of its whole drop, on each axis.
    def share(ys: list[float]) -> float:
        return (ys[14] - ys[0]) / (ys[-1] - ys[0])

    assert share(linear) == pytest.approx((8 - 8 / 15) / (8 - 8 / 30), abs=0.01)
    assert share(logged) == pytest.approx(math.log(15) / math.log(30), abs=0.01)
    assert 'alt="loss per token (log scale): 8 at step 1, 0.2667 at step 30"' in widget.static_html()
    widget.close()


def test_disclosures_keep_what_the_user_opened_across_renders(client):
    state = trained_state(samples={"step": 10, "items": [{"prompt": "2+3=", "text": "5"}]})
    widget = JobWidget(client, state)
    state.add_log_lines(["[engine] ready"])
    widget.render()
    assert (
        widget.logs.selected_index is None and widget.samples.selected_index == 0
    )  # defaults: log shut, samples open
    widget.logs.selected_index = 0  # the user opens the log tail (a click sets this from the browser)
    widget.samples.selected_index = None  # and closes the samples
    assert state.logs_open  # so the feed reads the log often while it is shown
    for step in range(5):
        state.add_log_lines([f"line {step}"])
        state.set_job(
            job_json(
                30 + step,
                samples={
                    "step": 20 + step,
                    "items": [{"prompt": "2+3=", "text": "5"}, {"prompt": "7+5=", "text": "12"}],
                },
            )
        )
        widget.render()
    assert widget.logs.selected_index == 0 and widget.samples.selected_index is None
    assert "line 4" in widget.logs_body.value and widget.logs.titles == ("log tail: last 6 lines",)
    assert widget.samples.titles == ("samples at step 24",) and "7+5=" in widget.samples_body.value
    widget.logs.selected_index = None
    assert not state.logs_open
    widget.logs.selected_index = 0
    # The static picture keeps the same choice.
    picture = widget.static_html()
    assert "<details open><summary>log tail: last 6 lines</summary>" in picture
    assert "<details><summary>samples at step 24</summary>" in picture
    widget.close()


def test_relative_times_say_how_long_ago_and_when_that_changes():
    assert ago(2) == ("just now", 3)
    assert ago(12) == ("10 s ago", 3)
    assert ago(125) == ("2 min ago", 55)
    assert ago(7300) == ("2 h ago", 3500)
    assert ago(-4)[0] == "just now"  # another host's clock a little ahead


def test_a_running_job_shows_relative_times_and_a_finished_one_a_clock_time():
    state = trained_state()
    now = time.time()
    snap = state.snapshot()
    assert "started 2 min ago" in job_view.stats_parts(snap, now)
    assert job_view.refresh_in(snap, now) == pytest.approx(5, abs=1.5)  # "just now" for the last progress
    state.set_job(job_json(30, updated_at=now - 40, summed_loss=987.6))
    parts = job_view.stats_parts(state.snapshot(), now)
    assert (
        "last progress 40 s ago" in parts
        and "summed loss 987.6" in parts
        and "loss per token 0.2667" in parts
    )
    finished = now - 3600
    state.set_job({**job_json(30, status="done"), "finished_at": finished})
    snap = state.snapshot()
    assert f"finished {time.strftime('%Y-%m-%d %H:%M', time.localtime(finished))}" in job_view.stats_parts(
        snap, now
    )
    assert job_view.refresh_in(snap, now) is None  # nothing changes by itself any more


def test_throttle_renders_again_when_the_view_asks_without_being_marked():
    rendered: list[float] = []

    def render() -> float | None:
        rendered.append(time.monotonic())
        return 0.3 if len(rendered) < 3 else None

    throttle = RenderThrottle(render, lambda: len(rendered) >= 3)
    throttle.mark_dirty()
    deadline = time.monotonic() + 10
    while len(rendered) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    throttle.flush()
    assert len(rendered) == 3  # one mark, three renders: two asked for by the view itself
    assert rendered[1] - rendered[0] >= 0.29 and rendered[2] - rendered[1] >= 0.29
    time.sleep(0.5)
    assert len(rendered) == 3 and throttle._thread is None  # then it rests


def test_static_picture_is_self_contained_html_with_the_final_curve(client):
    state = trained_state(
        steps=12,
        status="done",
        eval_loss_per_token=1.5,
        eval_history=[{"step": 12, "eval_loss_per_token": 1.5}],
    )
    state.add_metrics(
        [
            {
                "at": 10.0 + i,
                "device": "cpu",
                "cpu_percent": 50.0,
                "ram_used_bytes": 4,
                "ram_total_bytes": 16,
                "job_cpu_percent": 25.0,
                "job_ram_bytes": 2,
            }
            for i in range(3)
        ],
        note="CPU host: no GPU metrics",
    )
    widget = JobWidget(client, state)
    bundle = widget._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # the live view, and next to it the picture
    picture = bundle["text/html"]
    assert (
        'class="cortex-job-static"' in picture and "<svg" not in picture
    )  # charts only as <img>: sanitizers keep those
    assert (
        "step 12/12" in picture
        and "loss per token 0.6667" in picture
        and "eval loss per token 1.5" in picture
    )
    assert "<b>lr-3e-3</b> <code>job-render</code>" in picture and ">done</span>" in picture
    assert "CPU host: no GPU metrics" in picture and picture.count("GPU metrics") == 1
    images = re.findall(r'<img src="data:image/svg\+xml;base64,([^"]+)" alt="([^"]*)"', picture)
    assert [alt for _, alt in images] == [
        "loss per token: 8 at step 1, 0.6667 at step 12",
        "device metrics",
    ]
    loss_svg = base64.b64decode(images[0][0]).decode()
    assert len(ElementTree.fromstring(loss_svg).find(f"{SVG}polyline").get("points").split()) == 12
    device = ElementTree.fromstring(base64.b64decode(images[1][0]).decode())
    labels = [text.text for text in device.iter(f"{SVG}text")]
    assert {"host CPU", "host RAM", "job CPU", "job RAM"} <= set(labels)
    widget.close()


def idle_job(frees_in_s: float) -> dict:
    """A client-driven job with nothing to do, freeing its device in `frees_in_s`."""
    job = job_json(30, source="primitive")
    job["idle"] = {"timeout_s": 300.0, "frees_at": time.time() + frees_in_s}
    return job


def test_an_idle_job_counts_down_to_freeing_its_device_and_offers_free_device(client):
    state = JobState("job-render")
    state.set_job(idle_job(272.4))
    widget = JobWidget(client, state)
    first = re.search(r"freeing the device in (\d:\d\d)", widget.header.value)
    assert ">idle<" in widget.header.value and first and first.group(1) in ("4:32", "4:31")
    assert widget.free_button.layout.display is None and widget.cancel_button.layout.display == "none"
    widget.throttle.mark_dirty()  # the countdown then redraws itself, with no new data from the backend
    wait_until(lambda: first.group(1) not in widget.header.value, 5)
    later = re.search(r"freeing the device in 4:(\d\d)", widget.header.value)
    assert later and int(later.group(1)) < int(first.group(1)[2:])
    widget.close()


def test_a_moving_countdown_does_not_rewrite_the_cells_picture_but_a_new_state_does(client):
    # Each picture rewrite re-creates the widget's view: a keep-alive countdown moving every second must
    # not cause one, or the view is rebuilt under the user's hand.
    state = JobState("job-render")
    state.set_job(idle_job(272.4))
    widget = JobWidget(client, state)
    now = state.snapshot()
    assert "freeing the device in" in (now.detail or "")
    job = idle_job(150.2)
    state.set_job(job)
    later = state.snapshot()
    assert later.detail != now.detail
    assert widget.picture_moment(later) == widget.picture_moment(now)
    state.set_job({**job, "status": "done", "finished_at": time.time(), "idle": None})
    assert widget.picture_moment(state.snapshot()) != widget.picture_moment(now)
    widget.close()
