"""Line charts as inline SVG strings: no plotting package, small payloads, fine in any frontend."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH = 360
HEIGHT = 170
MARGIN_LEFT = 46
MARGIN_RIGHT = 10
MARGIN_TOP = 24
MARGIN_BOTTOM = 26


@dataclass(frozen=True)
class Line:
    label: str
    color: str
    points: Sequence[tuple[float, float]]
    dashed: bool = False


def line_chart(
    title: str,
    lines: Sequence[Line],
    x_label: str = "",
    y_range: tuple[float, float] | None = None,
    empty_text: str = "no data yet",
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """An SVG with axes, min/max ticks, a legend and one polyline per series."""
    drawn = [line for line in lines if line.points]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}"'
        f' role="img" aria-label="{escape(title)}" style="font-family:sans-serif;font-size:10px">',
        f'<text x="{MARGIN_LEFT}" y="14" font-size="11" font-weight="bold" fill="currentColor">{escape(title)}</text>',
    ]
    plot_w = width - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = height - MARGIN_TOP - MARGIN_BOTTOM
    parts.append(
        f'<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{plot_w}" height="{plot_h}" fill="none"'
        ' stroke="currentColor" stroke-opacity="0.25"/>'
    )
    if not drawn:
        parts.append(
            f'<text x="{MARGIN_LEFT + plot_w / 2}" y="{MARGIN_TOP + plot_h / 2}" text-anchor="middle"'
            f' fill="currentColor" fill-opacity="0.6">{escape(empty_text)}</text></svg>'
        )
        return "".join(parts)
    xs = [x for line in drawn for x, _ in line.points]
    ys = [y for line in drawn for _, y in line.points if math.isfinite(y)]
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range if y_range else (min(ys, default=0.0), max(ys, default=1.0))
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def sx(x: float) -> float:
        return MARGIN_LEFT + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return MARGIN_TOP + (1 - (y - y0) / (y1 - y0)) * plot_h

    for value in (y0, y1):
        parts.append(
            f'<text x="{MARGIN_LEFT - 4}" y="{sy(value) + 3:.1f}" text-anchor="end" fill="currentColor">{_tick(value)}</text>'
        )
    for value, anchor in ((x0, "start"), (x1, "end")):
        parts.append(
            f'<text x="{sx(value):.1f}" y="{height - MARGIN_BOTTOM + 12}" text-anchor="{anchor}" fill="currentColor">'
            f"{_tick(value)}</text>"
        )
    if x_label:
        parts.append(
            f'<text x="{MARGIN_LEFT + plot_w / 2}" y="{height - 4}" text-anchor="middle" fill="currentColor"'
            f' fill-opacity="0.7">{escape(x_label)}</text>'
        )
    legend_x = width - MARGIN_RIGHT
    for line in reversed(drawn):
        label = escape(line.label)
        parts.append(f'<text x="{legend_x}" y="14" text-anchor="end" fill="{line.color}">{label}</text>')
        legend_x -= 7 * len(line.label) + 12
    for line in drawn:
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line.points if math.isfinite(y))
        dash = ' stroke-dasharray="4 3"' if line.dashed else ""
        if len(line.points) == 1:
            x, y = line.points[0]
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{line.color}"/>')
        else:
            parts.append(f'<polyline fill="none" stroke="{line.color}" stroke-width="1.6"{dash} points="{coords}"/>')
    parts.append("</svg>")
    return "".join(parts)


def _tick(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e4 or magnitude < 1e-2:
        return f"{value:.2g}"
    if magnitude >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"
