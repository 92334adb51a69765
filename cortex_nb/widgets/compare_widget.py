"""The comparison view of `cortex_nb.compare`: overlaid loss and eval curves, the table of
hyperparameters and final metrics, and the A/B samples with each token shaded by how much less (red)
or more (green) likely the other run finds it."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any, Protocol

import ipywidgets as widgets

from ..views import ComparedRuns, ScoredSample
from .svg import Line, line_chart, svg_img

if TYPE_CHECKING:
    import pandas as pd


class Comparison(ComparedRuns, Protocol):
    """What this view reads of a `cortex_nb.comparison.Comparison` (which shows itself through it)."""

    curves: pd.DataFrame
    table: pd.DataFrame


ABSample = ScoredSample

PALETTE = ("#2563eb", "#ea580c", "#16a34a", "#9333ea", "#db2777", "#0891b2", "#ca8a04", "#4b5563")
# |log p difference| at which a token's shade is full.
FULL_SHADE_NATS = 4.0


class ComparisonWidget(widgets.VBox):
    def __init__(self, comparison: Comparison) -> None:
        self.comparison = comparison
        self.curves = widgets.HTML(curves_svg(comparison))
        self.table = widgets.HTML(table_html(comparison))
        self.samples = widgets.HTML(ab_html(comparison))
        super().__init__(
            children=[
                widgets.HTML(f"<b>{escape(repr(comparison))}</b>"),
                self.curves,
                self.table,
                self.samples,
            ]
        )
        self.add_class("cortex-compare-widget")

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget view, and next to it the same comparison as static HTML: what a notebook shows
        where the widget's kernel or model is gone (a comparison never changes once drawn)."""
        bundle = super()._repr_mimebundle_(**kwargs) or {}
        bundle["text/html"] = static_html(self.comparison)
        return bundle

    def __repr__(self) -> str:
        return repr(self.comparison)


def static_html(comparison: Comparison) -> str:
    """The whole comparison as one self-contained HTML block (the curves as an image: viewers drop
    inline SVG from untrusted output)."""
    return (
        '<div class="cortex-compare-static">'
        f"<div><b>{escape(repr(comparison))}</b></div>"
        f"<div>{svg_img(curves_svg(comparison, standalone=True), 'loss per token of each run')}</div>"
        f"{table_html(comparison)}{ab_html(comparison)}</div>"
    )


def curves_svg(comparison: Comparison, standalone: bool = False) -> str:
    lines = []
    for index, job in enumerate(comparison.jobs):
        color = PALETTE[index % len(PALETTE)]
        rows = comparison.curves[comparison.curves["job_id"] == job["job_id"]]
        label = comparison.label(job["job_id"])
        train = [
            (float(r.step), float(r.loss_per_token))
            for r in rows.itertuples()
            if r.loss_per_token == r.loss_per_token
        ]
        held_out = [
            (float(r.step), float(r.eval_loss_per_token))
            for r in rows.itertuples()
            if r.eval_loss_per_token == r.eval_loss_per_token
        ]
        lines.append(Line(label, color, train))
        if held_out:
            lines.append(Line(f"{label} eval", color, held_out, dashed=True))
    return line_chart(
        "loss per token (dashed: eval)",
        lines,
        x_label="step",
        empty_text="no steps recorded",
        width=560,
        height=220,
        standalone=standalone,
    )


def table_html(comparison: Comparison) -> str:
    return (
        '<div class="cortex-compare-table" style="overflow-x:auto">'
        + shown_table(comparison).to_html(index=False)
        + "</div>"
    )


def shown_table(comparison: Comparison) -> pd.DataFrame:
    """The table as a reader sees it: "–" where a run has no value (a client's own loop has no planned
    steps or batch size), never `None` or `NaN`."""

    def cell(value: Any) -> Any:
        if value is None or (isinstance(value, float) and value != value):
            return "–"
        return f"{value:.4g}" if isinstance(value, float) else value

    return comparison.table.astype(object).map(cell)


def ab_html(comparison: Comparison) -> str:
    if not comparison.ab:
        return ""
    others = {
        job["job_id"]: [j["job_id"] for j in comparison.jobs if j["job_id"] != job["job_id"]]
        for job in comparison.jobs
    }
    rows = []
    for sample in comparison.ab:
        other = others[sample.job_id][0]
        rows.append(
            f"<tr><td>{escape(sample.prompt)}</td><td>{escape(comparison.label(sample.job_id))}</td>"
            f"<td>{shaded_tokens(sample, other)}</td>"
            f"<td style='opacity:.7'>under {escape(comparison.label(other))}</td></tr>"
        )
    return (
        '<details open class="cortex-compare-samples"><summary>A/B samples (greedy, from each run\'s checkpoint;'
        " shade: log p under the other run minus its own)</summary><table><tr><th>prompt</th><th>run</th>"
        "<th>sample</th><th></th></tr>" + "".join(rows) + "</table></details>"
    )


def shaded_tokens(sample: ABSample, other_job_id: str) -> str:
    spans = []
    for token, difference in zip(sample.tokens, sample.difference(other_job_id), strict=True):
        strength = min(abs(difference) / FULL_SHADE_NATS, 1.0)
        color = f"rgba(220,38,38,{strength:.2f})" if difference < 0 else f"rgba(22,163,74,{strength:.2f})"
        spans.append(
            f'<span class="cortex-ab-token" data-logprob-diff="{difference:.4f}" title="{difference:+.3f}"'
            f' style="background:{color}">{escape(token)}</span>'
        )
    return "<code>" + "".join(spans) + "</code>"
