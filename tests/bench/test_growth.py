"""The endurance run's probes and slopes (``bench/growth.py``): a slope or a verdict that is
wrong would call a leak flat, or a flat resource a leak."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from aetcd import rpc
from growth import (
    ETCD_METRICS,
    Growth,
    Sample,
    Tolerance,
    dir_bytes,
    fill_groups,
    growth,
    key_groups,
    open_fds,
    process_sample,
    prometheus_values,
    rates,
    read_samples,
    rss_bytes,
    scrape,
    slope_per_hour,
    store_keys,
    write_sample,
)

from segtxn.metastore.etcd_server import EtcdServer

MIB = 2**20


def test_slope_is_the_least_squares_line_per_hour() -> None:
    line = [(t, 5.0 + 2.0 * t) for t in (0.0, 60.0, 120.0, 180.0)]
    assert slope_per_hour(line) == pytest.approx(7200.0)
    # symmetric noise around a flat line leaves it flat
    assert slope_per_hour([(0, 10), (60, 12), (120, 10), (180, 12), (240, 10)]) == pytest.approx(
        0.0, abs=1e-9
    )
    assert slope_per_hour([(0, 10), (0, 20)]) == 0.0
    assert slope_per_hour([(0, 10)]) == 0.0


def samples(values: list[float], name: str = "x.rss_bytes", every_s: float = 60.0) -> list[Sample]:
    return [{"t_s": i * every_s, name: v} for i, v in enumerate(values)]


def test_warm_up_samples_do_not_count() -> None:
    # a start-up jump, then flat: flat once the warm-up is left out
    series = samples([10 * MIB, 100 * MIB, 200 * MIB, 200 * MIB, 200 * MIB, 200 * MIB])
    (with_warmup,) = growth(series, warmup_s=120.0)
    assert (with_warmup.samples, with_warmup.start, with_warmup.per_hour) == (4, 200 * MIB, 0.0)
    assert with_warmup.verdict == "flat"
    (without,) = growth(series, warmup_s=0.0)
    assert without.per_hour > without.allowed_per_hour
    assert without.verdict == "settling"  # the jump is in the first half


def test_a_steady_leak_grows_and_a_settling_one_settles() -> None:
    leak = samples([100 * MIB + i * MIB for i in range(11)])  # 1 MiB a minute
    (g,) = growth(leak, warmup_s=0.0)
    assert g.per_hour == pytest.approx(60 * MIB)
    assert g.last_half_per_hour == pytest.approx(60 * MIB)
    assert g.verdict == "GROWS"
    settling = samples([100 * MIB + min(i, 4) * 5 * MIB for i in range(11)])
    (s,) = growth(settling, warmup_s=0.0)
    assert s.per_hour > s.allowed_per_hour
    assert s.last_half_per_hour == 0.0
    assert s.verdict == "settling"


def test_tolerance_floors_by_unit_and_scales_with_the_level() -> None:
    t = Tolerance(relative_per_h=0.05, bytes_floor_per_h=2 * MIB, count_floor_per_h=10)
    assert t.allowed("broker.rss_bytes", 10 * MIB) == 2 * MIB
    assert t.allowed("broker.rss_bytes", 1000 * MIB) == 50 * MIB
    assert t.allowed("store.keys", 100) == 10
    assert t.allowed("store.keys", 10_000) == 500
    # 20 keys an hour on 100: a leak; the same on 10,000: flat
    g = Growth("store.keys", 5, 100, 120, 100, 120, 20.0, 20.0, t.allowed("store.keys", 100))
    assert g.verdict == "GROWS"


def test_clocks_revisions_and_counts_are_not_resources() -> None:
    series = [
        {"t_s": 0.0, "etcd.revision": 10.0, "count.sent": 0.0, "store.keys": 50.0},
        {"t_s": 60.0, "etcd.revision": 9000.0, "count.sent": 1200.0, "store.keys": 50.0},
        {"t_s": 120.0, "etcd.revision": 18000.0, "count.sent": 2400.0, "store.keys": 50.0},
    ]
    assert [g.name for g in growth(series, warmup_s=0.0)] == ["store.keys"]
    assert rates(series, warmup_s=60.0) == {"sent": pytest.approx(20.0)}
    assert rates(series[:1], warmup_s=0.0) == {}


def test_prometheus_values_sum_labels_and_skip_comments() -> None:
    text = (
        "# HELP etcd_mvcc_db_total_size_in_bytes Total size\n"
        "# TYPE etcd_mvcc_db_total_size_in_bytes gauge\n"
        "etcd_mvcc_db_total_size_in_bytes 1.2288e+06\n"
        'segtxn_broker_topics{segtxn_broker_id="a"} 3\n'
        'segtxn_broker_topics{segtxn_broker_id="b"} 4\n'
        "etcd_mvcc_db_total_size_in_bytes_extra 7\n"
    )
    wanted = ["etcd_mvcc_db_total_size_in_bytes", "segtxn_broker_topics", "absent"]
    assert prometheus_values(text, wanted) == {
        "etcd_mvcc_db_total_size_in_bytes": 1228800.0,
        "segtxn_broker_topics": 7.0,
    }


def test_key_groups_by_path_components_under_the_namespace() -> None:
    keys = [b"/ns/txn/1", b"/ns/txn/2", b"/ns/topics/a/b", b"/ns/topics/a/c", b"/ns/dedup"]
    assert key_groups(keys, b"/ns") == {"/txn": 2, "/topics": 2, "/dedup": 1}
    assert key_groups(keys, b"/ns", depth=2)["/topics/a"] == 2


def test_dir_bytes_counts_every_file_below(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "deeper" / "b").write_bytes(b"y" * 234)
    assert dir_bytes(tmp_path) == 1234
    assert dir_bytes(tmp_path / "missing") == 0


def test_process_probes_see_a_new_descriptor(tmp_path: Path) -> None:
    before = open_fds(os.getpid())
    with open(tmp_path / "f", "w"):
        assert open_fds(os.getpid()) == before + 1
    assert rss_bytes(os.getpid()) > 1 * MIB
    assert set(process_sample("me", os.getpid())) == {"me.rss_bytes", "me.fds"}
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: /proc has no entry for it any more
    assert process_sample("gone", gone.pid) == {}
    assert process_sample("never", None) == {}


def test_samples_file_round_trip_skips_the_settings_line(tmp_path: Path) -> None:
    buffer = io.StringIO()
    buffer.write('{"settings": {"duration_s": 60}}\n')
    write_sample(buffer, {"t_s": 0.0, "store.keys": 3.0})
    write_sample(buffer, {"t_s": 60.0, "store.keys": 4.0})
    path = tmp_path / "samples.jsonl"
    path.write_text(buffer.getvalue())
    assert read_samples(path) == [{"t_s": 0.0, "store.keys": 3.0}, {"t_s": 60.0, "store.keys": 4.0}]


def test_etcd_probes_against_a_real_server(etcd_server: EtcdServer) -> None:
    with grpc.insecure_channel(etcd_server.endpoint) as channel:
        kv = rpc.KVStub(channel)
        for key in (
            b"/endure-t/txn/1",
            b"/endure-t/txn/2",
            b"/endure-t/topics/a",
            b"/endure-tx/no",
        ):
            kv.Put(rpc.PutRequest(key=key, value=b"v"), timeout=10)
    assert store_keys(etcd_server.endpoint, "/endure-t") == {
        "store.keys": 3.0,
        "store.keys:/txn": 2.0,
        "store.keys:/topics": 1.0,
    }
    metrics = scrape(f"http://{etcd_server.endpoint}/metrics", ETCD_METRICS)
    # every name the endurance table relies on is one this etcd exports
    assert set(metrics) == set(ETCD_METRICS.values())
    assert metrics["etcd.db_bytes"] >= metrics["etcd.db_in_use_bytes"] > 0


def test_a_key_group_that_empties_is_zero_not_missing() -> None:
    seen: set[str] = set()
    first = {"t_s": 0.0, "store.keys": 3.0, "store.keys:/txn-op": 3.0}
    fill_groups(first, seen)
    second = {"t_s": 60.0, "store.keys": 0.0}
    fill_groups(second, seen)
    assert second["store.keys:/txn-op"] == 0.0
    failed_probe = {"t_s": 120.0}  # the range failed: nothing is made up
    fill_groups(failed_probe, seen)
    assert failed_probe == {"t_s": 120.0}


def test_a_shrinking_resource_is_not_called_growing() -> None:
    (g,) = growth(samples([100 * MIB - i * MIB for i in range(11)]), warmup_s=0.0)
    assert g.verdict == "shrinks"
