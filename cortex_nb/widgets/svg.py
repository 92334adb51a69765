"""Line charts as inline SVG strings: no plotting package, small payloads, fine in any frontend.

A chart scales with its container (a viewBox, width 100%), so it follows the cell's width. The same
chart also renders `standalone` (fixed size, explicit colours), for the static picture a saved
notebook keeps as an `<img>` (where `currentColor` would mean black on any theme).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH = 360
HEIGHT = 170
# A chart grows with the cell up to this factor of its drawn size (text grows with it).
MAX_SCALE = 1.6
MARGIN_LEFT = 46
MARGIN_RIGHT = 10
MARGIN_TOP = 34
MARGIN_BOTTOM = 26
STANDALONE_INK = "#374151"


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
    log_y: bool = False,
    standalone: bool = False,
) -> str:
    """An SVG with axes, min/max ticks (and decades on a log scale), a legend and one polyline per series.

    With `log_y`, points at or below zero cannot be drawn and are left out (the legend says so).
    """
    ink = STANDALONE_INK if standalone else "currentColor"
    if log_y:
        kept = [
            Line(
                line.label,
                line.color,
                [(x, y) for x, y in line.points if y > 0 and math.isfinite(y)],
                line.dashed,
            )
            for line in lines
        ]
        hidden = sum(len(line.points) for line in lines) - sum(len(line.points) for line in kept)
        lines = kept
        if hidden:
            title += f" ({hidden} points ≤ 0 not shown)"
    drawn = [line for line in lines if any(math.isfinite(y) for _, y in line.points)]
    size = (
        f'width="{width}" height="{height}"'
        if standalone
        else f'width="100%" style="max-width:{round(width * MAX_SCALE)}px;height:auto;display:block"'
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" {size} role="img"'
        f' aria-label="{escape(title)}" font-family="sans-serif" font-size="10">',
    ]
    if standalone:
        parts.append(f'<rect width="{width}" height="{height}" fill="white"/>')
    parts.append(
        f'<text x="{MARGIN_LEFT}" y="14" font-size="11" font-weight="bold" fill="{ink}">{escape(title)}</text>'
    )
    plot_w = width - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = height - MARGIN_TOP - MARGIN_BOTTOM
    parts.append(
        f'<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{plot_w}" height="{plot_h}" fill="none"'
        f' stroke="{ink}" stroke-opacity="0.25"/>'
    )
    if not drawn:
        parts.append(
            f'<text x="{MARGIN_LEFT + plot_w / 2}" y="{MARGIN_TOP + plot_h / 2}" text-anchor="middle"'
            f' fill="{ink}" fill-opacity="0.6">{escape(empty_text)}</text></svg>'
        )
        return "".join(parts)
    scale = math.log10 if log_y else (lambda value: value)
    xs = [x for line in drawn for x, _ in line.points]
    ys = [y for line in drawn for _, y in line.points if math.isfinite(y)]
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range if y_range and not log_y else (min(ys), max(ys))
    if x1 == x0:
        x1 = x0 + 1
    v0, v1 = scale(y0), scale(y1)
    if v1 == v0:
        v0, v1 = v0 - 0.5, v1 + 0.5

    def sx(x: float) -> float:
        return MARGIN_LEFT + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return MARGIN_TOP + (1 - (scale(y) - v0) / (v1 - v0)) * plot_h

    y_ticks = [y0, y1]
    if log_y:
        decades = [10.0**power for power in range(math.ceil(v0), math.floor(v1) + 1)]
        y_ticks += [
            value for value in decades if abs(sy(value) - sy(y0)) > 10 and abs(sy(value) - sy(y1)) > 10
        ]
        for value in decades:
            parts.append(
                f'<line x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT + plot_w}" y1="{sy(value):.1f}" y2="{sy(value):.1f}"'
                f' stroke="{ink}" stroke-opacity="0.12"/>'
            )
    for value in y_ticks:
        parts.append(
            f'<text x="{MARGIN_LEFT - 4}" y="{sy(value) + 3:.1f}" text-anchor="end" fill="{ink}">{_tick(value)}</text>'
        )
    for value, anchor in ((x0, "start"), (x1, "end")):
        parts.append(
            f'<text x="{sx(value):.1f}" y="{height - MARGIN_BOTTOM + 12}" text-anchor="{anchor}" fill="{ink}">'
            f"{_tick(value)}</text>"
        )
    if x_label:
        parts.append(
            f'<text x="{MARGIN_LEFT + plot_w / 2}" y="{height - 4}" text-anchor="middle" fill="{ink}"'
            f' fill-opacity="0.7">{escape(x_label)}</text>'
        )
    # The legend has a row of its own under the title: a swatch (dashed like its line) and the label.
    legend_x = MARGIN_LEFT
    for line in drawn:
        dash = ' stroke-dasharray="3 2"' if line.dashed else ""
        parts.append(
            f'<line x1="{legend_x}" x2="{legend_x + 12}" y1="24" y2="24" stroke="{line.color}" stroke-width="2"{dash}/>'
            f'<text x="{legend_x + 15}" y="27" fill="{line.color}">{escape(line.label)}</text>'
        )
        legend_x += 15 + 6 * len(line.label) + 12
    for line in drawn:
        points = [(x, y) for x, y in line.points if math.isfinite(y)]
        dash = ' stroke-dasharray="4 3"' if line.dashed else ""
        if len(points) == 1:
            x, y = points[0]
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{line.color}"/>')
        else:
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
            parts.append(
                f'<polyline fill="none" stroke="{line.color}" stroke-width="1.6"{dash} points="{coords}"/>'
            )
    parts.append("</svg>")
    return "".join(parts)


def svg_img(svg: str, alt: str) -> str:
    """An SVG as an `<img>` with a data URL: kept by the HTML sanitizers of notebook viewers, which
    drop inline `<svg>` from untrusted output."""
    data = base64.b64encode(svg.encode()).decode("ascii")
    return (
        f'<img src="data:image/svg+xml;base64,{data}" alt="{escape(alt, quote=True)}" style="max-width:100%">'
    )


def _tick(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e4 or magnitude < 1e-2:
        return f"{value:.2g}"
    if magnitude >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"
