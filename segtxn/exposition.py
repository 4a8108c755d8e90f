"""Prometheus metrics of every segtxn server: one shape for brokers and coordinators.

Each server keeps its own :class:`Metrics` (several servers may share a process: tests,
``segtxn standalone``) and answers ``GET /metrics`` with :func:`response`. The families
follow Prometheus's conventions: ``segtxn_`` prefix, base units in the name
(``_seconds``, ``_bytes``), ``_total`` on counters and nowhere else, labels with bounded
values. Nothing is added to every series (no OpenTelemetry scope or target labels: the
scrape adds ``instance`` and ``job``).

Why not OpenTelemetry's Prometheus exporter: it labels every series with its
instrumentation scope, adds ``target_info``, and its ``Counter.add`` costs microseconds a
call (attribute hashing, aggregation, a lock), which was ~8 % of a producing broker's CPU.
What happens per message here is an integer addition; everything else is read when
``/metrics`` is scraped, by the collectors each server registers.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

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


class Metrics:
    """The metric families of one server; :meth:`render` writes them in Prometheus's text
    format. Families are declared once (a name may not repeat: ValueError)."""

    def __init__(self, component: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._declared: dict[str, tuple[str, Instrument | Read]] = {}
        self._component = component
        self.registry.register(_Declared(self))

    def _declare(self, name: str, help_: str, instrument: Instrument | Read) -> None:
        if name in self._declared:
            raise ValueError(f"metric {name} declared twice")
        self._declared[name] = (help_, instrument)

    def count(self, name: str, help_: str) -> Count:
        """A counter without labels; ``name`` ends in ``_total``."""
        count = Count()
        self._declare(name, help_, count)
        return count

    def labelled_count(self, name: str, help_: str, labels: Sequence[str]) -> LabelledCount:
        count = LabelledCount(labels)
        self._declare(name, help_, count)
        return count

    def histogram(self, name: str, help_: str) -> Histogram:
        histogram = Histogram()
        self._declare(name, help_, histogram)
        return histogram

    def labelled_histogram(self, name: str, help_: str, labels: Sequence[str]) -> LabelledHistogram:
        histogram = LabelledHistogram(labels)
        self._declare(name, help_, histogram)
        return histogram

    def gauge(self, name: str, help_: str, read: Read) -> None:
        """A gauge without labels, read by calling ``read`` at each scrape."""
        self._declare(name, help_, read)

    def add_collector(self, collector: Collector) -> None:
        """Families with labels that come and go (per topic, per coordinator id)."""
        self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def families(self) -> Iterator[Metric]:
        yield _info(self._component)
        for name, (help_, instrument) in self._declared.items():
            yield _family(name, help_, instrument)


class _Declared(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.families()


def _family(name: str, help_: str, instrument: Instrument | Read) -> Metric:
    if isinstance(instrument, Count):
        return CounterMetricFamily(name, help_, value=instrument.value)
    if isinstance(instrument, LabelledCount):
        counter = CounterMetricFamily(name, help_, labels=instrument.labels)
        for key, value in sorted(instrument.values.items()):
            counter.add_metric(key, value)
        return counter
    if isinstance(instrument, Histogram):
        return HistogramMetricFamily(
            name, help_, buckets=instrument.buckets(), sum_value=instrument.sum
        )
    if isinstance(instrument, LabelledHistogram):
        family = HistogramMetricFamily(name, help_, labels=instrument.labels)
        for key, histogram in sorted(instrument.values.items()):
            family.add_metric(key, histogram.buckets(), histogram.sum)
        return family
    return GaugeMetricFamily(name, help_, value=instrument())


def _info(component: str) -> Metric:
    try:
        release = version("segtxn")
    except PackageNotFoundError:
        release = "unknown"
    info = GaugeMetricFamily(
        "segtxn_build_info",
        "Always 1: the segtxn release and the kind of server this is",
        labels=["version", "component"],
    )
    info.add_metric([release, component], 1)
    return info


def gauge_family(
    name: str, help_: str, labels: Sequence[str], samples: Iterable[tuple[Sequence[str], float]]
) -> GaugeMetricFamily:
    """A gauge family with one sample per label-value tuple (for collectors)."""
    family = GaugeMetricFamily(name, help_, labels=labels)
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def counter_family(
    name: str, help_: str, labels: Sequence[str], samples: Iterable[tuple[Sequence[str], float]]
) -> CounterMetricFamily:
    """A counter family with one sample per label-value tuple; ``name`` ends in ``_total``."""
    family = CounterMetricFamily(name, help_, labels=labels)
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def response(metrics: Metrics) -> web.Response:
    """The answer to ``GET /metrics``: Prometheus's text format, version 0.0.4."""
    return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})
