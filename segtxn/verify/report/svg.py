"""The report's plots as inline SVG strings: nothing to fetch, no script, any browser.

Every plot shares one x axis (seconds since the run's first recorded event) so they line up
when stacked: :func:`plot` draws series (lines, steps, stacked bars, dots) under the run's
faults and topology changes (dashed lines, a shaded band for a pause or a downtime, labels in
lanes above the plot so they never overlap) and its anomaly samples (red triangles on the x
axis); :func:`timeline` draws the faults and the anomalies alone, labelled. Axes have ticks
at nice steps (:mod:`.scale`). Each data shape has the class ``data``: a test counts them.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Literal

from segtxn.verify.report.model import AnomalyPoint, Mark, Points
from segtxn.verify.report.scale import (
    Scale,
    axis_ticks,
    lanes,
    nice_step,
    text_width,
    tick_label,
    ticks,
)

WIDTH = 960
LEFT, RIGHT, BOTTOM = 64, 24, 34
PLOT_H = 170
FONT, SMALL = 12, 11
LANE_H = 15
ANOMALY = "#d62728"
MARK_COLORS = {
    "kill": "#c0392b",
    "pause": "#e67e22",
    "down": "#8e44ad",
    "split": "#2471a3",
    "merge": "#148f77",
}
Style = Literal["line", "step", "bars", "dots"]


@dataclass(frozen=True)
class Series:
    """One plotted series: ``points`` (x seconds, y value); ``bars`` stack on each other in
    the order given, one bar a second from x to x + 1; ``step`` holds each value for a
    second."""

    name: str
    points: Points
    color: str
    style: Style = "line"
    dash: str = ""
    width: float = 2.0


def _x_scale(x_max: float) -> Scale:
    return Scale(0.0, max(x_max, 1.0), LEFT, WIDTH - RIGHT)


def _text(x: float, y: float, text: str, **attrs: str | float) -> str:
    extra = "".join(f" {k.strip('_').replace('_', '-')}='{v}'" for k, v in attrs.items())
    return f"<text x='{x:.1f}' y='{y:.1f}'{extra}>{html.escape(text)}</text>"


def _mark_labels(marks: list[Mark], x: Scale) -> tuple[list[int], int]:
    """Each mark's label lane, and how many lanes there are."""
    spans = [(x(m.at_s) + 3, x(m.at_s) + 3 + text_width(m.label, SMALL)) for m in marks]
    placed = lanes(spans)
    return placed, max(placed, default=-1) + 1


def _x_axis(x: Scale, y0: float) -> list[str]:
    parts = [f"<line x1='{x.start}' x2='{x.end}' y1='{y0}' y2='{y0}' stroke='#333'/>"]
    for value, label in axis_ticks(x.lo, x.hi, x.end - x.start, SMALL, " s"):
        px = x(value)
        parts.append(f"<line x1='{px:.1f}' x2='{px:.1f}' y1='{y0}' y2='{y0 + 5}' stroke='#333'/>")
        parts.append(
            _text(px, y0 + 18, label, text_anchor="middle", font_size=SMALL, class_="tick")
        )
    return parts


def _marks(marks: list[Mark], x: Scale, top: float, bottom: float, labelled: bool) -> list[str]:
    """The marks over a plot from ``top`` to ``bottom``; labels (if ``labelled``) in lanes
    above ``top``."""
    placed, count = _mark_labels(marks, x)
    parts = []
    for mark, lane in zip(marks, placed, strict=True):
        color = MARK_COLORS.get(mark.kind, "#555")
        x0 = x(mark.at_s)
        if mark.until_s is not None and mark.until_s > mark.at_s:
            parts.append(
                f"<rect class='fault' x='{x0:.1f}' y='{top}' width='{x(mark.until_s) - x0:.1f}' "
                f"height='{bottom - top}' fill='{color}' fill-opacity='0.12'/>"
            )
        label_y = top - 4 - (count - 1 - lane) * LANE_H
        line_top = label_y - SMALL + 2 if labelled else top
        parts.append(
            f"<line class='fault' x1='{x0:.1f}' x2='{x0:.1f}' y1='{line_top:.1f}' y2='{bottom}' "
            f"stroke='{color}' stroke-dasharray='4 3'><title>{html.escape(mark.label)}"
            f"</title></line>"
        )
        if labelled:
            parts.append(
                _text(x0 + 3, label_y, mark.label, font_size=SMALL, fill=color, class_="mark")
            )
    return parts


def _anomalies(points: list[AnomalyPoint], x: Scale, y0: float) -> list[str]:
    parts = []
    for a in points:
        px = x(a.at_s)
        parts.append(
            f"<path class='anomaly' data-anomaly='{a.kind}' d='M{px:.1f},{y0 - 9:.1f} "
            f"l-6,-10 h12 z' fill='{ANOMALY}'>"
            f"<title>{html.escape(a.kind)} #{a.index + 1} at {a.at_s:.1f} s: "
            f"{html.escape(a.sample)}</title></path>"
        )
    return parts


def _svg(height: float, parts: list[str], label: str) -> str:
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' role='img' aria-label='{html.escape(label)}' "
        f"viewBox='0 0 {WIDTH} {height:.0f}' width='{WIDTH}' height='{height:.0f}' "
        f"font-family='sans-serif' font-size='{FONT}'>{''.join(parts)}</svg>"
    )


def _y_max(series: list[Series]) -> float:
    stacked: dict[float, float] = {}
    top = 0.0
    for s in series:
        for px, value in s.points:
            if s.style == "bars":
                stacked[px] = stacked.get(px, 0.0) + value
                top = max(top, stacked[px])
            else:
                top = max(top, value)
    return top


def _series(series: list[Series], x: Scale, y: Scale) -> list[str]:
    parts = []
    base: dict[float, float] = {}
    for s in series:
        if not s.points:
            continue
        title = f"<title>{html.escape(s.name)}</title>"
        if s.style == "bars":
            for px, value in s.points:
                if value <= 0:
                    continue
                width = max(x(min(px + 1, x.hi)) - x(px) - 1, 1.0)  # the last may be cut short
                below = base.get(px, 0.0)
                base[px] = below + value
                top_px = y(below + value)
                parts.append(
                    f"<rect class='data' x='{x(px):.1f}' y='{top_px:.1f}' width='{width:.1f}' "
                    f"height='{y(below) - top_px:.1f}' fill='{s.color}'>{title}</rect>"
                )
        elif s.style == "dots":
            parts += [
                f"<circle class='data' cx='{x(min(px, x.hi)):.1f}' cy='{y(v):.1f}' r='2' "
                f"fill='{s.color}'/>"
                for px, v in s.points
            ]
        else:
            d = []
            for i, (px, value) in enumerate(s.points):
                # a point past the axis's end (a last second's middle) is drawn at the end
                d.append(f"{'M' if i == 0 else 'L'}{x(min(px, x.hi)):.1f},{y(value):.1f}")
                if s.style == "step":
                    d.append(f"L{x(min(px + 1, x.hi)):.1f},{y(value):.1f}")
            dash = f" stroke-dasharray='{s.dash}'" if s.dash else ""
            parts.append(
                f"<path class='data' d='{' '.join(d)}' fill='none' stroke='{s.color}' "
                f"stroke-width='{s.width}' stroke-linejoin='round'{dash}>{title}</path>"
            )
    return parts


def plot(
    series: list[Series],
    *,
    x_max: float,
    unit: str,
    marks: list[Mark],
    anomalies: list[AnomalyPoint],
    label: str,
) -> str:
    """One plot of ``series`` over ``[0, x_max]`` seconds, y from zero (``unit`` after the
    y tick labels), with the marks and the anomaly samples."""
    x = _x_scale(x_max)
    _, count = _mark_labels(marks, x)
    top = 10 + count * LANE_H
    bottom = top + PLOT_H
    raw = _y_max(series)
    most = max(2, PLOT_H // 32)
    step = nice_step(raw, most) if raw > 0 else 1.0
    y_top = max(step, -(-raw // step) * step)
    y = Scale(0.0, y_top, bottom, top)
    parts = []
    for value in ticks(0.0, y_top, most):
        py = y(value)
        parts.append(
            f"<line x1='{LEFT}' x2='{WIDTH - RIGHT}' y1='{py:.1f}' y2='{py:.1f}' stroke='#e6e6e6'/>"
        )
        text = tick_label(value, step) + unit
        parts.append(
            _text(LEFT - 6, py + 4, text, text_anchor="end", font_size=SMALL, class_="tick")
        )
    parts.append(f"<line x1='{LEFT}' x2='{LEFT}' y1='{top}' y2='{bottom}' stroke='#333'/>")
    parts += _marks(marks, x, top, bottom, labelled=True)
    if any(s.points for s in series):
        parts += _series(series, x, y)
    else:
        parts.append(_text((LEFT + WIDTH) / 2, (top + bottom) / 2, "no data", text_anchor="middle"))
    parts += _x_axis(x, bottom)
    parts += _anomalies(anomalies, x, bottom)
    return _svg(bottom + BOTTOM, parts, label)


def timeline(marks: list[Mark], anomalies: list[AnomalyPoint], *, x_max: float) -> str:
    """The run's faults and topology changes, then its anomaly samples, each labelled."""
    x = _x_scale(x_max)
    _, count = _mark_labels(marks, x)
    faults_top = 12 + max(count, 1) * LANE_H
    faults_bottom = faults_top + 18
    spans = []
    for a in anomalies:
        text = f"{a.kind} #{a.index + 1}"
        spans.append((x(a.at_s) - 6, x(a.at_s) + 10 + text_width(text, SMALL)))
    placed = lanes(spans)
    rows = max(placed, default=0) + 1
    anomalies_top = faults_bottom + 14
    bottom = anomalies_top + rows * LANE_H + 10
    parts = [
        _text(4, faults_bottom - 4, "faults", font_size=SMALL, fill="#555"),
        _text(4, anomalies_top + LANE_H - 3, "anomalies", font_size=SMALL, fill="#555"),
        f"<rect x='{LEFT}' y='{anomalies_top}' width='{WIDTH - LEFT - RIGHT}' "
        f"height='{bottom - anomalies_top - 4}' fill='#fafafa'/>",
    ]
    parts += _marks(marks, x, faults_top, faults_bottom, labelled=True)
    for mark in marks:
        parts.append(
            f"<circle class='data' cx='{x(mark.at_s):.1f}' cy='{faults_bottom - 9}' r='4' "
            f"fill='{MARK_COLORS.get(mark.kind, '#555')}'/>"
        )
    if not marks:
        parts.append(_text(LEFT + 4, faults_bottom - 4, "none", font_size=SMALL, fill="#555"))
    for a, lane in zip(anomalies, placed, strict=True):
        px = x(a.at_s)
        y_mid = anomalies_top + lane * LANE_H + LANE_H / 2 + 1
        parts.append(
            f"<path class='anomaly data' data-anomaly='{a.kind}' "
            f"d='M{px:.1f},{y_mid + 5:.1f} l-5,-10 h10 z' "
            f"fill='{ANOMALY}'><title>{html.escape(a.sample)}</title></path>"
        )
        parts.append(
            _text(px + 8, y_mid + 4, f"{a.kind} #{a.index + 1}", font_size=SMALL, fill=ANOMALY)
        )
    if not anomalies:
        parts.append(_text(LEFT + 4, anomalies_top + LANE_H - 3, "none", font_size=SMALL))
    parts += _x_axis(x, bottom)
    return _svg(bottom + BOTTOM, parts, "timeline of faults and anomalies")


def legend(series: list[Series]) -> str:
    """An HTML legend: a swatch in each series' colour and its name."""
    items = [
        f"<span class='key'><span class='swatch' style='background:{s.color}'></span>"
        f"{html.escape(s.name)}</span>"
        for s in series
    ]
    return f"<div class='legend'>{''.join(items)}</div>"
