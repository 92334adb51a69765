"""What the job widget shows, as pure functions of a `Snapshot`: HTML and SVG strings.

The live widget sets them as trait values; the static picture a saved notebook keeps is built from
the same pieces, so the two never disagree. Numbers are labelled as the backend names them
("loss per token", "summed loss"; host CPU/RAM vs the job's own processes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from html import escape

from ..job_state import Snapshot
from ..protocol.states import (
    JOB_RUNNING,
    WORD_CANCELLED,
    WORD_DONE,
    WORD_FAILED,
    WORD_IDLE,
    WORD_QUEUED,
    WORD_SAMPLING,
    WORD_STARTING,
    WORD_STOPPED,
    WORD_TRAINING,
    format_loss,
    progress_timing,
)
from .relative_time import ago
from .svg import Line, line_chart, svg_img

LOG_LINES_SHOWN = 40
OPEN_IN_SIDEBAR_CLASS = "cortex-open-in-sidebar"
STATIC_CLASS = "cortex-job-static"
NEUTRAL = "#6b7280"
# One colour per display word (`cortex_nb.protocol.states.display_state`). A cancel is the user's choice, not a
# failure: it is as neutral as a queued job, and only `failed` is red.
BADGE_COLORS = {
    WORD_QUEUED: NEUTRAL,
    WORD_STARTING: "#2563eb",
    WORD_TRAINING: "#2563eb",
    WORD_SAMPLING: "#0f766e",
    WORD_IDLE: "#64748b",
    WORD_DONE: "#15803d",
    WORD_FAILED: "#b91c1c",
    WORD_CANCELLED: NEUTRAL,
    WORD_STOPPED: "#475569",  # ended by the user with its adapter kept: neither a failure nor the planned end
    "running": "#2563eb",  # a source run's word while it runs (it has no training phases)
}
BAR_STYLES = {WORD_DONE: "success", WORD_FAILED: "danger", WORD_CANCELLED: "", WORD_STOPPED: ""}
BAR_COLORS = {"success": "#15803d", "danger": "#b91c1c", "info": "#0891b2", "": "#9ca3af"}
COLORS = {
    "train": "#2563eb",
    "eval": "#ea580c",
    "util": "#16a34a",
    "memory": "#9333ea",
    "mismatch": "#dc2626",
}
# A running job whose progress is older than this says how old it is.
STALE_AFTER_S = 15.0


@dataclass(frozen=True)
class ViewOptions:
    """What the user chose in the live widget; the static picture keeps it."""

    log_scale: bool = False
    samples_open: bool = True
    logs_open: bool = False


def job_repr(snap: Snapshot) -> str:
    """Short and stable: status, step, loss. Frontends cut text/plain reprs at 110 characters."""
    total = f"/{snap.total_steps}" if snap.total_steps else ""
    text = f"<cortex job {snap.job_id} {snap.status} step {snap.step}{total}"
    if snap.last_loss is not None:
        text += f" loss per token {format_loss(snap.last_loss)}"
    return text + ">"


def open_in_sidebar_html(job_id: str) -> str:
    """A button the JupyterLab extension picks up by class and data attribute."""
    return (
        f'<button class="{OPEN_IN_SIDEBAR_CLASS} jupyter-button" data-cortex-open-job="{escape(job_id, quote=True)}"'
        ' title="Open this job in the Cortex sidebar">Open in sidebar</button>'
    )


def trained(snap: Snapshot) -> bool:
    """The training is over but the job still holds its device (sampling after it, or idle)."""
    return snap.job_status == JOB_RUNNING and snap.status in (WORD_SAMPLING, WORD_IDLE)


def header_html(snap: Snapshot) -> str:
    """Name first (what the user called it), then id, model, device, the status word and its detail
    (why it waits, when an idle job frees its device)."""
    color = BADGE_COLORS.get(snap.status, NEUTRAL)
    parts = [
        f"<b>{escape(snap.name)}</b> <code>{escape(snap.job_id)}</code>"
        if snap.name
        else f"<b>{escape(snap.job_id)}</b>"
    ]
    parts.append(f"model <code>{escape(snap.model or '?')}</code>")
    parts.append(f"device <code>{escape(', '.join(snap.devices) or '-')}</code>")
    badge = (
        f'<span class="cortex-status" style="background:{color};color:white;border-radius:8px;'
        f'padding:1px 8px">{escape(snap.status)}</span>'
    )
    detail = (
        f' <span class="cortex-status-detail" style="opacity:.7">{escape(snap.detail)}</span>'
        if snap.detail
        else ""
    )
    return " · ".join(parts) + " " + badge + detail


def message_html(snap: Snapshot) -> str:
    return f'<span style="opacity:.8">{escape(snap.message)}</span>' if snap.message else ""


def stats_parts(snap: Snapshot, now: float) -> list[str]:
    """Step, pace, the latest losses (named as the backend names them) and when, as plain text."""
    progress = snap.job.get("progress") or {}
    total = f"/{snap.total_steps}" if snap.total_steps else ""
    parts = [f"step {snap.step}{total}"]
    # ETA and tokens/s as the sidebar writes them: the same record fields, the same function.
    timing = progress_timing(progress)
    if timing:
        parts.append(timing)
    if snap.last_loss is not None:
        parts.append(f"loss per token {format_loss(snap.last_loss)}")
    if progress.get("summed_loss") is not None:
        parts.append(f"summed loss {format_loss(progress['summed_loss'])}")
    if snap.last_eval is not None:
        parts.append(f"eval loss per token {format_loss(snap.last_eval)}")
    if snap.checkpoints:
        parts.append(f"checkpoint {snap.checkpoints[-1]}")
    if snap.job.get("device_seconds") is not None:
        parts.append(device_seconds_text(snap.job["device_seconds"], progress.get("budget_device_s")))
    parts.extend(time_parts(snap, now))
    return parts


def device_seconds_text(used: float, budget: float | None) -> str:
    """Device-seconds used (the backend's count, the one a budget is spent against), and of what budget."""
    return f"{used:,.0f} device-s" + (f" of {budget:,.0f} budget" if budget else "")


def time_parts(snap: Snapshot, now: float) -> list[str]:
    """When it started or finished. Relative while the job runs (the widget refreshes them); a clock
    time once it ended, which stays true in a saved notebook."""
    started, finished = snap.job.get("started_at"), snap.job.get("finished_at")
    if snap.finished:
        return [f"finished {clock_time(finished)}"] if finished else []
    parts = [f"started {ago(now - started)[0]}"] if started else []
    updated = (snap.job.get("progress") or {}).get("updated_at")
    if updated and now - updated > STALE_AFTER_S:
        parts.append(f"last progress {ago(now - updated)[0]}")
    return parts


def refresh_in(snap: Snapshot, now: float) -> float | None:
    """Seconds until a text of this view changes by itself (a countdown, a relative time), or None."""
    if snap.finished:
        return None
    if snap.idle or snap.job.get("keep_alive_until"):
        return 1.0 - now % 1.0 + 0.01  # "freeing the device in 4:32" counts down each second
    waits = [
        ago(now - moment)[1]
        for moment in (snap.job.get("started_at"), (snap.job.get("progress") or {}).get("updated_at"))
        if moment
    ]
    return min(waits) if waits else None


def clock_time(moment: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(moment))


def stats_html(snap: Snapshot, now: float) -> str:
    return '<span style="padding-left:8px">' + escape(" · ".join(stats_parts(snap, now))) + "</span>"


def bar_style(snap: Snapshot) -> str:
    return BAR_STYLES.get(snap.status, "info")


def loss_chart_svg(snap: Snapshot, log_scale: bool = False, standalone: bool = False) -> str:
    lines = [
        Line("train", COLORS["train"], snap.loss),
        Line("eval", COLORS["eval"], snap.eval_loss, dashed=True),
    ]
    title = "loss per token" + (" (log scale)" if log_scale else "")
    return line_chart(
        title,
        lines,
        x_label="step",
        empty_text="waiting for the first step",
        log_y=log_scale,
        standalone=standalone,
    )


def mismatch_chart_svg(snap: Snapshot, standalone: bool = False) -> str:
    """RL losses: the mean |sampler logprob - trainer logprob| per step (docs/sampling.md says what a
    rising curve means)."""
    worst = f" · last max {format_loss(snap.last_mismatch_max)}" if snap.last_mismatch_max is not None else ""
    return line_chart(
        "sampler ↔ trainer mismatch, mean |Δ logprob|" + worst,
        [Line("mismatch", COLORS["mismatch"], snap.mismatch)],
        x_label="step",
        empty_text="no RL step yet",
        standalone=standalone,
    )


def device_chart_svg(snap: Snapshot, standalone: bool = False) -> str:
    """GPU utilisation and memory of the job's device, or, on a CPU host, the host's CPU and RAM next
    to the job's own processes (where the backend could attribute them)."""
    metrics = snap.metrics
    if snap.metric_kind == "gpu":
        lines = [
            Line("GPU util %", COLORS["util"], metrics.get("gpu_utilization_percent", [])),
            Line("GPU memory %", COLORS["memory"], metrics.get("gpu_memory_percent", [])),
        ]
        title = "GPU"
    elif snap.metric_kind == "cpu":
        lines = [
            Line("host CPU", COLORS["util"], metrics.get("cpu_percent", []), dashed=True),
            Line("host RAM", COLORS["memory"], metrics.get("ram_percent", []), dashed=True),
            Line("job CPU", COLORS["util"], metrics.get("job_cpu_percent", [])),
            Line("job RAM", COLORS["memory"], metrics.get("job_ram_percent", [])),
        ]
        title = "CPU / RAM, % of host"
    else:
        lines, title = [], "device"
    shown = snap.metrics_device or ", ".join(snap.devices)
    devices = f" · {shown}" if shown else ""
    return line_chart(
        title + devices,
        lines,
        x_label="seconds",
        y_range=(0.0, 100.0),
        empty_text="waiting for device metrics",
        standalone=standalone,
    )


def device_note_html(snap: Snapshot) -> str:
    """The one quiet line about missing GPU metrics (e.g. "CPU host: no GPU metrics")."""
    if not snap.metrics_note:
        return ""
    return (
        f'<div class="cortex-device-note" style="opacity:.6;font-size:11px">{escape(snap.metrics_note)}</div>'
    )


def samples_title(snap: Snapshot) -> str:
    return f"samples at step {snap.samples_step}" if snap.samples else "samples"


def samples_table(snap: Snapshot) -> str:
    rows = "".join(
        f"<tr><td style='opacity:.7'>{escape(prompt)}</td><td><code>{escape(text)}</code></td></tr>"
        for prompt, text in snap.samples
    )
    return f"<table>{rows}</table>"


def logs_title(snap: Snapshot) -> str:
    shown = len(snap.log_tail[-LOG_LINES_SHOWN:])
    dropped = f" ({snap.logs_dropped} older lines dropped by the backend)" if snap.logs_dropped else ""
    return f"log tail: last {shown} lines{dropped}"


def logs_pre(snap: Snapshot) -> str:
    lines = snap.log_tail[-LOG_LINES_SHOWN:]
    body = escape("\n".join(lines)) if lines else "no log lines yet"
    return f'<pre style="max-height:14em;overflow:auto;font-size:11px;margin:0">{body}</pre>'


def logs_html(snap: Snapshot, open_: bool = False) -> str:
    """The log tail as an HTML disclosure (static pictures and views that draw it once)."""
    return _details(logs_title(snap), logs_pre(snap), open_)


def _details(summary: str, body: str, open_: bool) -> str:
    return f"<details{' open' if open_ else ''}><summary>{escape(summary)}</summary>{body}</details>"


def progress_bar_html(snap: Snapshot) -> str:
    total = max(snap.total_steps or snap.step, 1)
    percent = 100.0 * min(snap.step, total) / total
    color = BAR_COLORS.get(bar_style(snap), BAR_COLORS["info"])
    return (
        f'<div style="display:inline-block;vertical-align:middle;width:320px;height:14px;background:#e5e7eb">'
        f'<div style="width:{percent:.1f}%;height:14px;background:{color}"></div></div>'
    )


def static_html(snap: Snapshot, options: ViewOptions, now: float | None = None) -> str:
    """The whole widget as one self-contained HTML block: what a saved notebook shows without a kernel.

    Charts are `<img>` data URLs (viewers drop inline SVG from untrusted output); disclosures are plain
    `<details>`, open as the user left them.
    """
    now = time.time() if now is None else now
    loss = loss_chart_svg(snap, options.log_scale, standalone=True)
    device = device_chart_svg(snap, standalone=True)
    loss_alt = "loss per token" + (" (log scale)" if options.log_scale else "")
    parts = [
        f'<div class="{STATIC_CLASS}" data-cortex-job="{escape(snap.job_id, quote=True)}">',
        f"<div>{header_html(snap)}</div>",
        f"<div>{message_html(snap)}</div>" if snap.message else "",
        f"<div>{progress_bar_html(snap)}{stats_html(snap, now)}</div>",
        f"<div>{svg_img(loss, f'{loss_alt}: ' + _series_text(snap))} {svg_img(device, 'device metrics')}"
        + (
            f" {svg_img(mismatch_chart_svg(snap, standalone=True), 'sampler-trainer mismatch')}"
            if snap.mismatch
            else ""
        )
        + "</div>",
        device_note_html(snap),
        _details(samples_title(snap), samples_table(snap), options.samples_open) if snap.samples else "",
        logs_html(snap, options.logs_open),
        "" if snap.finished else picture_note_html(snap, now),
        f"<div>{open_in_sidebar_html(snap.job_id)}</div>",
        "</div>",
    ]
    return "".join(parts)


def continued_html(snap: Snapshot, options: ViewOptions, cell: int | None, now: float | None = None) -> str:
    """The record of the cell that first showed a run, once a kernel restart moved its live view to `cell`
    (`%cortex job ID` there): where the run went, then its picture (the final one once it ended)."""
    where = f"cell {cell}" if cell else "another cell"
    then = "its final picture below" if snap.finished else "the picture below is where it was then"
    note = (
        f'<div class="cortex-continued" style="font-style:italic">continued in {where}:'
        f" after a kernel restart, <code>%cortex job {escape(snap.job_id)}</code> reattached this run"
        f" there; {then}</div>"
    )
    return note + static_html(snap, options, now)


def picture_note_html(snap: Snapshot, now: float) -> str:
    """Under a picture of a run still going: when it was taken and how to see the run live (a notebook
    reopened without the kernel that drew it shows this picture)."""
    return (
        f'<div class="cortex-picture-note" style="opacity:.6;font-size:11px">picture as of {clock_time(now)};'
        f" <code>%cortex job {escape(snap.job_id)}</code> shows the run live</div>"
    )


def _series_text(snap: Snapshot) -> str:
    """The curve in words, for the image's alt text: first and last loss per token."""
    if snap.first_loss is None or snap.last_loss is None:
        return "no steps yet"
    return (
        f"{format_loss(snap.first_loss)} at step {snap.loss[0][0]:g},"
        f" {format_loss(snap.last_loss)} at step {snap.step}"
    )
