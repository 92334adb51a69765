"""The picture `%cortex stats` shows above its DataFrame: queue wait (median, p95) and device-hours per
owner over the window, as horizontal bars in one inline SVG (no plotting package), with a text form of
the same bars for terminals, CI and saved notebooks' text outputs.

Every number is the backend's (`GET /v1/stats`); the chart only draws them, each bar's length in
proportion to the largest of its panel.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

WIDTH = 360
ROW_H = 16
LABEL_W = 110
VALUE_W = 64
PANEL_GAP = 10
TITLE_H = 18
TEXT_BAR = 24
COLORS = {"queue": "#2563eb", "owners": "#059669"}


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    text: str


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


def _seconds(value: float) -> str:
    return f"{value:.1f} s"


class StatsChart:
    """Two panels of bars from one `GET /v1/stats` answer."""

    def __init__(self, stats: dict[str, Any]) -> None:
        wait = stats["queue_wait"]
        self.queue = [
            Bar(name, float(wait[key]), _seconds(float(wait[key])))
            for name, key in (("median", "median_s"), ("p95", "p95_s"))
            if wait.get(key) is not None
        ]
        owners = sorted(stats["device_seconds"]["by_owner"].items(), key=lambda item: (-item[1], item[0]))
        self.owners = [Bar(owner, float(seconds), _hours(float(seconds))) for owner, seconds in owners]
        self.waited = int(wait.get("count") or 0)

    def panels(self) -> list[tuple[str, str, list[Bar]]]:
        return [
            (f"queue wait ({self.waited} started)", "queue", self.queue),
            ("device-hours per owner", "owners", self.owners),
        ]

    # text --------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        lines = []
        for title, _, bars in self.panels():
            lines.append(title)
            if not bars:
                lines.append("  (none in this window)")
            top = max((bar.value for bar in bars), default=0.0)
            width = max((len(bar.label) for bar in bars), default=0)
            for bar in bars:
                filled = round(bar.value / top * TEXT_BAR) if top > 0 else 0
                lines.append(f"  {bar.label:<{width}}  {'█' * filled:<{TEXT_BAR}}  {bar.text}")
        return "\n".join(lines)

    # SVG ---------------------------------------------------------------------------------------
    def bar_lengths(self) -> dict[str, dict[str, float]]:
        """panel -> label -> the drawn bar's length in SVG units (what `_repr_html_` draws)."""
        span = WIDTH - LABEL_W - VALUE_W
        lengths: dict[str, dict[str, float]] = {}
        for _, key, bars in self.panels():
            top = max((bar.value for bar in bars), default=0.0)
            lengths[key] = {bar.label: (bar.value / top * span if top > 0 else 0.0) for bar in bars}
        return lengths

    def _repr_html_(self) -> str:
        lengths = self.bar_lengths()
        height = sum(TITLE_H + max(len(bars), 1) * ROW_H + PANEL_GAP for _, _, bars in self.panels())
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="100%"'
            f' style="max-width:{WIDTH * 1.6:.0f}px;height:auto;display:block" role="img"'
            f' aria-label="queue wait and device-hours per owner" font-family="sans-serif" font-size="10">'
        ]
        y = 0
        for title, key, bars in self.panels():
            parts.append(
                f'<text x="0" y="{y + 12}" font-size="11" font-weight="bold" fill="currentColor">'
                f"{escape(title)}</text>"
            )
            y += TITLE_H
            if not bars:
                parts.append(
                    f'<text x="{LABEL_W}" y="{y + 11}" fill="currentColor" fill-opacity="0.6">'
                    "none in this window</text>"
                )
                y += ROW_H
            for bar in bars:
                length = lengths[key][bar.label]
                parts.append(
                    f'<text x="{LABEL_W - 6}" y="{y + 11}" text-anchor="end" fill="currentColor">'
                    f"{escape(bar.label)}</text>"
                    f'<rect data-panel="{key}" data-label="{escape(bar.label)}" x="{LABEL_W}" y="{y + 2}"'
                    f' width="{length:.2f}" height="{ROW_H - 4}" fill="{COLORS[key]}"/>'
                    f'<text x="{LABEL_W + length + 4:.2f}" y="{y + 11}" fill="currentColor">'
                    f"{escape(bar.text)}</text>"
                )
                y += ROW_H
            y += PANEL_GAP
        parts.append("</svg>")
        return "".join(parts)
