"""Prometheus metrics of every segtxn server: one shape for brokers and coordinators.

Each server keeps its own :class:`Metrics` (several servers may share a process: tests,
``segtxn standalone``) and answers ``GET /metrics`` with :func:`response`. The families
follow Prometheus's conventions: ``segtxn_`` prefix, base units in the name
(``_seconds``, ``_bytes``), ``_total`` on counters and nowhere else, labels with bounded
values. Nothing is added to every series (no OpenTelemetry scope or target labels: the
scrape adds ``instance`` and ``job``).

Why not OpenTelemetry's Prometheus exporter: it labels every series with its
instrumentation scope, adds ``target_info``, and its ``Counter.add`` and
``Histogram.record`` cost microseconds a call (attribute hashing, aggregation, a lock):
its counters were ~8 % of a producing broker's CPU. What happens per message here is an
integer addition (a histogram: a ``bisect`` too); everything else is read when ``/metrics``
is scraped, by the collectors each server registers. The text is written here too
(:meth:`Metrics.render`), a few microseconds a line: it runs on the event loop.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Protocol

from aiohttp import web

LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""Upper bounds of the latency histograms, in seconds (plus ``+Inf``)."""


class Count:
    """A monotonic count: a plain int, read when ``/metrics`` is scraped."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def add(self, amount: int) -> None:
        self.value += amount


class LabelledCount:
    """A counter with labels: ``add(1, {"kind": "write"})`` (OpenTelemetry's call shape).

    The label values must come from a small fixed set (an enum, an outcome): each distinct
    combination is a series for as long as the process lives."""

    def __init__(self, labels: Sequence[str]) -> None:
        self.labels = tuple(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def add(self, amount: float, attributes: Mapping[str, str]) -> None:
        key = tuple(str(attributes[name]) for name in self.labels)
        self.values[key] = self.values.get(key, 0) + amount


class Histogram:
    """Observations counted into fixed buckets: a ``bisect`` and two additions each."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound
        self.sum = 0.0

    def record(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, ``+Inf`` last (the exposition's shape)."""
        out = []
        total = 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == math.inf else repr(float(bound)), float(total)))
        return out


class LabelledHistogram:
    """Histograms keyed by label values from a small fixed set (see :class:`LabelledCount`)."""

    def __init__(self, labels: Sequence[str], bounds: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        self.labels = tuple(labels)
        self.bounds = tuple(bounds)
        self.values: dict[tuple[str, ...], Histogram] = {}

    def record(self, value: float, attributes: Mapping[str, str]) -> None:
        key = tuple(str(attributes[name]) for name in self.labels)
        histogram = self.values.get(key)
        if histogram is None:
            histogram = self.values[key] = Histogram(self.bounds)
        histogram.record(value)


Instrument = Count | LabelledCount | Histogram | LabelledHistogram
Read = Callable[[], float]
Labels = Sequence[str]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True)
class Family:
    """One metric family as it is written: a counter's ``name`` ends in ``_total``;
    a histogram's samples are :class:`Histogram` objects, the others' numbers."""

    name: str
    kind: str  # counter, gauge, histogram
    help: str
    labels: tuple[str, ...]
    samples: list[tuple[Labels, float]] = field(default_factory=list)
    histograms: list[tuple[Labels, Histogram]] = field(default_factory=list)


class Collector(Protocol):
    """Families read when ``/metrics`` is scraped (their series may come and go)."""

    def collect(self) -> Iterable[Family]: ...


class Metrics:
    """The metric families of one server; :meth:`render` writes them in Prometheus's text
    format. Families are declared once (a name may not repeat: ValueError)."""

    def __init__(self, component: str) -> None:
        self._declared: dict[str, tuple[str, Instrument | Read]] = {}
        self._collectors: list[Collector] = []
        self._info = gauge_family(
            "segtxn_build_info",
            "Always 1: the segtxn release and the kind of server this is",
            ["version", "component"],
            [([_release(), component], 1)],
        )

    def _declare(self, name: str, help_: str, instrument: Instrument | Read) -> None:
        if name in self._declared:
            raise ValueError(f"metric {name} declared twice")
        if isinstance(instrument, Count | LabelledCount):
            _check_counter(name)
        self._declared[name] = (help_, instrument)

    def count(self, name: str, help_: str) -> Count:
        """A counter without labels; ``name`` ends in ``_total``."""
        count = Count()
        self._declare(name, help_, count)
        return count

    def labelled_count(self, name: str, help_: str, labels: Labels) -> LabelledCount:
        count = LabelledCount(labels)
        self._declare(name, help_, count)
        return count

    def histogram(self, name: str, help_: str) -> Histogram:
        histogram = Histogram()
        self._declare(name, help_, histogram)
        return histogram

    def labelled_histogram(self, name: str, help_: str, labels: Labels) -> LabelledHistogram:
        histogram = LabelledHistogram(labels)
        self._declare(name, help_, histogram)
        return histogram

    def gauge(self, name: str, help_: str, read: Read) -> None:
        """A gauge without labels, read by calling ``read`` at each scrape."""
        self._declare(name, help_, read)

    def add_collector(self, collector: Collector) -> None:
        """Families with labels that come and go (per topic, per coordinator id)."""
        self._collectors.append(collector)

    def families(self) -> Iterator[Family]:
        yield self._info
        for name, (help_, instrument) in self._declared.items():
            yield _family(name, help_, instrument)
        for collector in self._collectors:
            yield from collector.collect()

    def render(self) -> bytes:
        """Every family in the text format, version 0.0.4.

        Written here rather than by prometheus_client's ``generate_latest``, which took
        three times as long (6,500 lines: 32 ms of CPU against 11), on the event loop at
        every scrape."""
        out: list[str] = []
        for family in self.families():
            _write(family, out)
        return "".join(out).encode()


def _family(name: str, help_: str, instrument: Instrument | Read) -> Family:
    if isinstance(instrument, Count):
        return counter_family(name, help_, [], [((), instrument.value)])
    if isinstance(instrument, LabelledCount):
        return counter_family(name, help_, instrument.labels, sorted(instrument.values.items()))
    if isinstance(instrument, Histogram):
        return Family(name, "histogram", help_, (), histograms=[((), instrument)])
    if isinstance(instrument, LabelledHistogram):
        return Family(
            name,
            "histogram",
            help_,
            instrument.labels,
            histograms=[(key, instrument.values[key]) for key in sorted(instrument.values)],
        )
    return gauge_family(name, help_, [], [((), instrument())])


def _release() -> str:
    try:
        return version("segtxn")
    except PackageNotFoundError:
        return "unknown"


def gauge_family(
    name: str, help_: str, labels: Labels, samples: Iterable[tuple[Labels, float]]
) -> Family:
    """A gauge family with one sample per label-value tuple (for collectors)."""
    return Family(name, "gauge", help_, tuple(labels), list(samples))


def counter_family(
    name: str, help_: str, labels: Labels, samples: Iterable[tuple[Labels, float]]
) -> Family:
    """A counter family with one sample per label-value tuple; ``name`` ends in ``_total``."""
    _check_counter(name)
    return Family(name, "counter", help_, tuple(labels), list(samples))


def _check_counter(name: str) -> None:
    if not name.endswith("_total"):
        raise ValueError(f"counter {name} must end in _total")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: Labels, extra: str = "") -> str:
    pairs = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _write(family: Family, out: list[str]) -> None:
    help_ = family.help.replace("\\", "\\\\").replace("\n", "\\n")
    out.append(f"# HELP {family.name} {help_}\n# TYPE {family.name} {family.kind}\n")
    for values, value in family.samples:
        out.append(f"{family.name}{_labels(family.labels, values)} {_number(value)}\n")
    for values, histogram in family.histograms:
        for le, count in histogram.buckets():
            labels = _labels(family.labels, values, f'le="{le}"')
            out.append(f"{family.name}_bucket{labels} {_number(count)}\n")
        plain = _labels(family.labels, values)
        out.append(f"{family.name}_count{plain} {_number(sum(histogram.counts))}\n")
        out.append(f"{family.name}_sum{plain} {_number(histogram.sum)}\n")


def response(metrics: Metrics) -> web.Response:
    """The answer to ``GET /metrics``: Prometheus's text format, version 0.0.4."""
    return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})
