"""The bounded data behind job views, and the SVG charts drawn from it (no backend needed)."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ElementTree

from cortex_nb.job_state import LOG_LINE_CHARS, LOG_TAIL_LINES, DecimatedSeries, JobState
from cortex_nb.widgets import job_view
from cortex_nb.widgets.svg import Line, line_chart


def test_decimated_series_stays_bounded_and_keeps_the_shape():
    series = DecimatedSeries(64)
    for step in range(1, 100_001):
        series.append(step, 1000.0 / step)
    points = series.points()
    assert len(points) == len(series) <= 64 and series.count == 100_000
    assert series.first == (1, 1000.0) and series.last == (100_000, 0.01)
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    assert xs == sorted(xs) and points[0] == (1, 1000.0) and xs[-1] > 99_000  # spans the whole run
    assert ys == sorted(ys, reverse=True)  # a falling curve still falls


def test_job_state_caps_log_lines_and_their_length():
    state = JobState("job-x")
    state.add_log_lines([f"line {i}" for i in range(5000)] + ["x" * 10_000])
    sizes = state.retained_sizes()
    assert sizes["log_lines"] == LOG_TAIL_LINES
    tail = state.snapshot().log_tail
    assert tail[-2] == "line 4999" and len(tail[-1]) == LOG_LINE_CHARS


def test_device_metrics_draw_gpu_when_present_and_cpu_ram_otherwise():
    gpu = JobState("job-gpu")
    gpu.add_metrics(
        [
            {
                "at": 100.0 + i,
                "device": "gpu:0",
                "gpu_utilization_percent": 50 + i,
                "gpu_memory_used_bytes": 4 << 30,
                "gpu_memory_total_bytes": 16 << 30,
                "cpu_percent": 10.0,
                "ram_used_bytes": 1,
                "ram_total_bytes": 2,
            }
            for i in range(5)
        ]
    )
    snap = gpu.snapshot()
    assert snap.metric_kind == "gpu" and snap.metrics["gpu_memory_percent"][0] == (0.0, 25.0)
    svg = job_view.device_chart_svg(snap)
    assert "GPU util %" in svg and "CPU %" not in svg
    ElementTree.fromstring(svg)

    two = JobState("job-two-devices")
    two.add_metrics(
        [
            {"at": 1.0, "device": "gpu:1", "gpu_utilization_percent": 10},
            {"at": 1.0, "device": "gpu:0", "gpu_utilization_percent": 90},
            {"at": 2.0, "device": "gpu:1", "gpu_utilization_percent": 20},
        ]
    )
    assert two.snapshot().metrics_device == "gpu:1"
    assert two.snapshot().metrics["gpu_utilization_percent"] == [
        (0.0, 10.0),
        (1.0, 20.0),
    ]  # one device per chart

    cpu = JobState("job-cpu")
    cpu.add_metrics(
        [
            {
                "at": 5.0,
                "device": "cpu",
                "cpu_percent": 42.0,
                "ram_used_bytes": 3 << 30,
                "ram_total_bytes": 12 << 30,
            }
        ],
        note="no NVIDIA GPU on this host",
    )
    snap = cpu.snapshot()
    assert snap.metric_kind == "cpu" and snap.metrics["ram_percent"] == [(0.0, 25.0)]
    assert "gpu_utilization_percent" not in snap.metrics
    assert "CPU / RAM, % of host · cpu" in job_view.device_chart_svg(snap)


def job_with_progress(steps: int, status: str = "running", **progress) -> dict:
    """A job as the backend answers it, with a progress record of `steps` points (loss 3.0 - step/10)."""
    record = {
        "source": "managed",
        "phase": "training" if status == "running" else "finished",
        "step": steps,
        "total_steps": steps,
        "loss_per_token": 3.0 - steps * 0.1,
        "tokens": 100 * steps,
        "tokens_per_s": 100.0,
        "elapsed_s": float(steps),
        "history": [{"step": s, "loss_per_token": 3.0 - s * 0.1} for s in range(1, steps + 1)],
        "eval_history": [],
        "updated_at": 1000.0 + steps,
        **progress,
    }
    return {
        "job_id": "job-s",
        "status": status,
        "name": None,
        "progress": record,
        "sub_jobs": [{"type": "training", "base_model": "tiny", "device": "cpu"}],
    }


def test_loss_chart_is_wellformed_svg_with_both_series():
    state = JobState("job-l")
    history = [{"step": s, "loss_per_token": 5.0 - s / 100} for s in range(1, 256)]
    evals = [{"step": s, "eval_loss_per_token": 5.1 - s / 100} for s in range(50, 256, 50)]
    state.set_job(job_with_progress(255, history=history, eval_history=evals))
    svg = job_view.loss_chart_svg(state.snapshot())
    root = ElementTree.fromstring(svg)
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 2
    assert len(lines[0].get("points").split()) == 255  # the backend's points, none merged again
    empty = line_chart("nothing", [Line("a", "#000", [])], empty_text="waiting <here>")
    assert "waiting &lt;here&gt;" in empty
    ElementTree.fromstring(empty)


def test_summary_and_repr_read_the_backends_record_as_text():
    state = JobState("job-s", model="tiny")
    state.set_job(
        job_with_progress(
            10, "done", eval_loss_per_token=2.5, eval_history=[{"step": 10, "eval_loss_per_token": 2.5}]
        )
    )
    summary = state.summary()
    assert summary == (
        "job-s (tiny) done: 10/10 steps in 0:10, loss per token 2.9 -> 2, eval loss per token 2.5, 100 tok/s"
    )
    assert job_view.job_repr(state.snapshot()) == "<cortex job job-s done step 10/10 loss per token 2>"


def test_small_losses_keep_four_significant_digits_and_the_widget_writes_timing_as_the_sidebar():
    """A loss of 0.0002457 never reads 0.0000; ETA and tokens/s come from the record through the one
    function the sidebar's generated twin mirrors (labextension/test/display_state.spec.ts)."""
    from cortex_nb.protocol.states import progress_timing

    state = JobState("job-small", model="tiny")
    job = job_with_progress(5, loss_per_token=0.0002457)
    job["progress"].update(phase="training", total_steps=3000, eta_s=232.4, tokens_per_s=1712.0)
    state.set_job(job)
    stats = " · ".join(job_view.stats_parts(state.snapshot(), now=time.time()))
    assert "loss per token 0.0002457" in stats and "0.0000" not in stats
    assert progress_timing(job["progress"]) == "ETA 3:52 · 1.7k tok/s" and "ETA 3:52 · 1.7k tok/s" in stats


def test_an_answer_without_the_record_keeps_the_header_and_progress_line_on_one_step():
    state = JobState("job-one", model="tiny")
    job = job_with_progress(258)
    job["progress"].update(phase="training", total_steps=3000)
    state.set_job(job)
    state.set_job({key: value for key, value in job.items() if key != "progress"})  # a cancel's answer
    snap = state.snapshot()
    assert snap.detail == "step 258/3000" and snap.step == 258


def test_a_run_stopped_and_saved_early_is_labelled_stopped_not_done():
    state = JobState("job-stopped", model="tiny")
    job = job_with_progress(831, "done")
    job["progress"].update(phase="stopped", total_steps=3000, last_checkpoint="final")
    state.set_job(job)
    snap = state.snapshot()
    assert (snap.status, snap.detail) == ("stopped", "at 831/3000 (checkpoint final)") and snap.finished
    assert "stopped</span>" in job_view.header_html(snap) and "at 831/3000 (checkpoint final)" in (
        job_view.header_html(snap)
    )


def test_a_waiting_job_says_why_and_an_idle_one_when_it_frees_its_device():
    state = JobState("job-q")
    state.set_job(
        {
            "job_id": "job-q",
            "status": "pending",
            "sub_jobs": [],
            "progress": None,
            "queue": {
                "position": 2,
                "reason": "1 ahead in the queue; waiting for a cpu slot: 4/4 held by jobs a, b",
                "blocked_by": ["job-a", "job-b"],
                "estimate_s": 35.0,
            },
        }
    )
    snap = state.snapshot()
    assert snap.status == "queued"
    assert (
        snap.detail
        == "#2 in the queue: 1 ahead in the queue; waiting for a cpu slot: 4/4 held by jobs a, b (about 0:35)"
    )
    import time

    state.set_job(
        {
            "job_id": "job-q",
            "status": "running",
            "sub_jobs": [{"type": "training", "base_model": "tiny"}],
            "idle": {"timeout_s": 300.0, "frees_at": time.time() + 272.4},
        }
    )
    snap = state.snapshot()
    assert snap.status == "idle" and snap.detail in (
        "freeing the device in 4:32",
        "freeing the device in 4:31",
    )
