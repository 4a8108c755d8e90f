"""segtxn's own Prometheus text writer, read back by prometheus_client's parser: label values
that need escaping, cumulative histogram buckets, counter names, declared-twice refusal."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from segtxn.exposition import Family, Metrics, counter_family, gauge_family


class Odd:
    def collect(self) -> list[Family]:
        return [
            gauge_family(
                "segtxn_test_odd",
                "help with a \\ and a\nnewline",
                ["topic"],
                [(['a "quoted" \\ topic\nname'], 1.5), (["inf"], math.inf), (["nan"], math.nan)],
            )
        ]


def parse(metrics: Metrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_what_is_written_reads_back() -> None:
    metrics = Metrics("test")
    count = metrics.count("segtxn_test_things_total", "things")
    count.add(3)
    by_kind = metrics.labelled_count("segtxn_test_kinds_total", "kinds", ["kind"])
    by_kind.add(2, {"kind": "b"})
    by_kind.add(1, {"kind": "a"})
    latency = metrics.histogram("segtxn_test_latency_seconds", "latency")
    for value in (0.0001, 0.003, 0.003, 100.0):
        latency.record(value)
    metrics.gauge("segtxn_test_level", "level", lambda: 7)
    metrics.add_collector(Odd())

    found = parse(metrics)
    assert found["segtxn_test_things_total"] == [({}, 3.0)]
    assert found["segtxn_test_kinds_total"] == [({"kind": "a"}, 1.0), ({"kind": "b"}, 2.0)]
    assert found["segtxn_test_level"] == [({}, 7.0)]
    buckets = {labels["le"]: value for labels, value in found["segtxn_test_latency_seconds_bucket"]}
    assert buckets["0.0005"] == 1 and buckets["0.005"] == 3 and buckets["30.0"] == 3
    assert buckets["+Inf"] == 4
    assert found["segtxn_test_latency_seconds_count"] == [({}, 4.0)]
    assert found["segtxn_test_latency_seconds_sum"][0][1] == pytest.approx(100.0061)
    odd = {labels["topic"]: value for labels, value in found["segtxn_test_odd"]}
    assert odd['a "quoted" \\ topic\nname'] == 1.5
    assert odd["inf"] == math.inf and math.isnan(odd["nan"])
    assert found["segtxn_build_info"][0][0]["component"] == "test"


def test_a_name_is_declared_once_and_counters_end_in_total() -> None:
    metrics = Metrics("test")
    metrics.gauge("segtxn_test_level", "level", lambda: 1)
    with pytest.raises(ValueError, match="declared twice"):
        metrics.gauge("segtxn_test_level", "again", lambda: 2)
    with pytest.raises(ValueError, match="must end in _total"):
        counter_family("segtxn_test_things", "things", [], [])
    with pytest.raises(ValueError, match="must end in _total"):
        metrics.count("segtxn_test_things", "things")
