"""Scales, ticks and label placement for the report's plots: the arithmetic, without SVG.

A plot maps data to pixels with a :class:`Scale`; its axes get "nice" ticks (steps of 1, 2 or
5 times a power of ten, as many as fit without their labels touching: :func:`ticks`);
labels that would overlap on one line are spread over lanes (:func:`lanes`). Text width is
estimated from the character count (:func:`text_width`): the page has no layout engine to
ask when it is written, and a generous estimate only costs a little space.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

CHAR_EM = 0.62
"""Width of an average character of the page's sans-serif font, in font sizes (digits and
lower-case letters are narrower; a generous estimate keeps labels apart)."""


@dataclass(frozen=True)
class Scale:
    """A linear map from ``[lo, hi]`` (data) to ``[start, end]`` (pixels); ``end`` may be
    below ``start`` (a y axis grows upwards). A zero-width domain maps everything to
    ``start``."""

    lo: float
    hi: float
    start: float
    end: float

    def __call__(self, value: float) -> float:
        if self.hi == self.lo:
            return self.start
        return self.start + (value - self.lo) / (self.hi - self.lo) * (self.end - self.start)


def nice_step(span: float, most: int) -> float:
    """The smallest step of 1, 2 or 5 times a power of ten that cuts ``span`` into at most
    ``most`` intervals (``span`` <= 0 or ``most`` < 1: 1)."""
    if span <= 0 or most < 1:
        return 1.0
    raw = span / most
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 5.0, 10.0):
        if factor * power >= raw * (1 - 1e-9):
            return factor * power
    return 10.0 * power  # unreachable: 10 * power >= raw always


def nice_max(value: float, most: int = 5) -> float:
    """The first tick at or above ``value``, for a y axis from zero (``value`` <= 0: 1)."""
    if value <= 0:
        return 1.0
    step = nice_step(value, most)
    return math.ceil(value / step - 1e-9) * step


def ticks(lo: float, hi: float, most: int) -> list[float]:
    """Tick values at a nice step in ``[lo, hi]`` (at most ``most`` + 1 of them)."""
    if hi <= lo:
        return [lo]
    step = nice_step(hi - lo, most)
    first = math.ceil(lo / step - 1e-9)
    last = math.floor(hi / step + 1e-9)
    return [round(n * step, 10) for n in range(first, last + 1)]


def tick_label(value: float, step: float) -> str:
    """``value`` as short as its axis's ``step`` allows: 12, 2.5, 40k, 1.2M."""
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= limit and step >= limit / 10:
            return _trim(value / limit, step / limit) + suffix
    return _trim(value, step)


def _trim(value: float, step: float) -> str:
    decimals = 0 if step >= 1 else min(6, math.ceil(-math.log10(step) - 1e-9))
    return f"{value:.{decimals}f}"


def text_width(text: str, font_px: float) -> float:
    """Estimated width of ``text`` in pixels."""
    return len(text) * font_px * CHAR_EM


def axis_ticks(
    lo: float, hi: float, length_px: float, font_px: float, unit: str = ""
) -> list[tuple[float, str]]:
    """The ticks of an axis ``length_px`` long: as many as fit with a gap of two characters
    between labels (the widest label decides), each with its label (``unit`` appended)."""
    most = max(1, int(length_px // (font_px * 2)))
    while most > 1:
        values = ticks(lo, hi, most)
        step = values[1] - values[0] if len(values) > 1 else hi - lo
        labels = [tick_label(v, step) + unit for v in values]
        widest = max(text_width(label, font_px) for label in labels) + 2 * font_px * CHAR_EM
        if widest * len(values) <= length_px:
            return list(zip(values, labels, strict=True))
        most -= 1
    values = ticks(lo, hi, 1)
    step = values[1] - values[0] if len(values) > 1 else max(hi - lo, 1.0)
    return [(v, tick_label(v, step) + unit) for v in values]


def lanes(spans: Sequence[tuple[float, float]], gap: float = 4.0) -> list[int]:
    """A lane for each of ``spans`` (``(left, right)`` pixels) so that no two in one lane
    overlap or come closer than ``gap``: each takes the lowest lane free at its left edge,
    in the order of their left edges (lane 0 first)."""
    ends: list[float] = []
    out = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        left, right = spans[i]
        for lane, end in enumerate(ends):
            if left >= end + gap:
                ends[lane] = right
                out[i] = lane
                break
        else:
            ends.append(right)
            out[i] = len(ends) - 1
    return out
