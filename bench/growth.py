"""Resource sampling and growth slopes for the endurance run (``bench/endurance.py``).

A system that runs for months must hold every resource flat under a steady load: memory,
open files, bytes on disk, metadata-store keys, etcd's database. This module reads each of
them from outside the processes (``/proc``, the data directories, etcd's ``/metrics`` and a
keys-only range, a broker's ``/metrics``), so what is measured is what an operator would
see, and turns a series of samples into a growth per hour: the least-squares slope of the
samples after a warm-up (start-up allocations, caches filling, the first retention and
compaction passes), with a verdict against a tolerance.

A sample is a flat ``{name: number}`` mapping (one JSON line in the samples file), so a run
can be plotted later without this code. Probes that fail (a process gone, etcd not
answering) leave their names out of the sample rather than stop the run: the table then says
how many samples a resource has.
"""

from __future__ import annotations

import json
import math
import os
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from common import print_rows

Sample = dict[str, float]
"""One sampling instant: ``t_s`` (seconds since the load started) and resource values."""

ETCD_METRICS = {
    "etcd_mvcc_db_total_size_in_bytes": "etcd.db_bytes",
    "etcd_mvcc_db_total_size_in_use_in_bytes": "etcd.db_in_use_bytes",
    "etcd_debugging_mvcc_keys_total": "etcd.keys",
    "etcd_debugging_mvcc_current_revision": "etcd.revision",
}
"""etcd's own gauges, by the name they get in a sample (``etcd.revision`` only grows: it
is context, not a resource)."""

BROKER_GAUGES = {
    "segtxn_broker_topics": "topics_loaded",
    "segtxn_broker_active_segments": "active_segments",
    "segtxn_broker_backlog_messages": "backlog",
    "segtxn_broker_producers": "producers",
    "segtxn_broker_consumers": "consumers",
}
"""A broker's gauges, sampled as ``<broker>.<name>``."""

NOT_RESOURCES = ("t_s", "etcd.revision")
"""Sample fields that grow by nature (a clock, a revision) and are never judged."""
COUNTS = "count."
"""Prefix of the load's cumulative counts (messages sent, transactions committed...): they
grow by nature too; their slope is the load's rate (:func:`rates`)."""


def is_resource(name: str) -> bool:
    return name not in NOT_RESOURCES and not name.startswith(COUNTS)


# ---------------------------------------------------------------------- probes


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (``VmRSS``). Raises OSError if the process is gone."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"process {pid} has no VmRSS (a zombie?)")


def open_fds(pid: int) -> int:
    """Open file descriptors of ``pid`` (sockets, files, pipes, epoll...)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def dir_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (0 if it does not exist); files removed
    while walking are skipped (retention deletes ledgers at any time)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def prometheus_values(text: str, names: Iterable[str]) -> dict[str, float]:
    """The values of the unlabelled series ``names`` in a Prometheus text exposition (a
    labelled series ``name{...}`` is summed over its labels)."""
    wanted = set(names)
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, rest = line.partition(" ")
        name = head.split("{", 1)[0]
        if name in wanted:
            found[name] = found.get(name, 0.0) + float(rest.split()[0])
    return found


def scrape(url: str, names: Mapping[str, str], prefix: str = "") -> Sample:
    """``names`` (metric → sample field) read from the ``/metrics`` at ``url``."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    values = prometheus_values(text, names)
    return {prefix + names[metric]: value for metric, value in values.items()}


def key_groups(keys: Iterable[bytes], namespace: bytes, depth: int = 1) -> Counter[str]:
    """Count keys by their first ``depth`` path components under ``namespace`` (``/txn``,
    ``/topics``...): which part of the store a growth is in."""
    groups: Counter[str] = Counter()
    for key in keys:
        rest = key[len(namespace) :] if key.startswith(namespace) else key
        parts = rest.decode(errors="replace").strip("/").split("/")
        groups["/" + "/".join(parts[:depth])] += 1
    return groups


def store_keys(endpoint: str, namespace: str, depth: int = 1) -> Sample:
    """The keys under ``namespace`` in etcd at ``endpoint`` (one keys-only range): their
    count as ``store.keys`` and per group (:func:`key_groups`) as ``store.keys:/group``."""
    import grpc
    from aetcd import rpc

    prefix = namespace.rstrip("/").encode() + b"/"
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    with grpc.insecure_channel(endpoint) as channel:
        reply = rpc.KVStub(channel).Range(
            rpc.RangeRequest(key=prefix, range_end=end, keys_only=True), timeout=30
        )
    keys = [kv.key for kv in reply.kvs]
    sample: Sample = {"store.keys": float(len(keys))}
    for group, count in key_groups(keys, prefix[:-1], depth).items():
        sample[f"store.keys:{group}"] = float(count)
    return sample


def fill_groups(sample: Sample, seen: set[str]) -> None:
    """Give ``sample`` a 0 for each key group seen in an earlier sample and gone from this one
    (an emptied group is a value, not a missing probe), and add its groups to ``seen``."""
    if "store.keys" not in sample:
        return
    groups = {name for name in sample if name.startswith("store.keys:")}
    for name in seen - groups:
        sample[name] = 0.0
    seen |= groups


def process_sample(name: str, pid: int | None) -> Sample:
    """``<name>.rss_bytes`` and ``<name>.fds`` of ``pid`` (empty if it is gone)."""
    if pid is None:
        return {}
    try:
        return {f"{name}.rss_bytes": float(rss_bytes(pid)), f"{name}.fds": float(open_fds(pid))}
    except OSError:
        return {}


# ---------------------------------------------------------------------- slopes


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``(t_s, value)`` points, in value units per hour (0 for fewer
    than two distinct times)."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 3600.0


@dataclass(frozen=True)
class Tolerance:
    """When a growth counts as flat: ``|slope| <= max(relative_per_h * mean, floor)``.

    The floor keeps small, noisy resources (a few fds, an allocator's arena) from failing on
    noise; the relative part scales with the resource.
    """

    relative_per_h: float = 0.05
    bytes_floor_per_h: float = 2 * 1024 * 1024
    count_floor_per_h: float = 10.0

    def allowed(self, name: str, mean: float) -> float:
        floor = self.bytes_floor_per_h if name.endswith("bytes") else self.count_floor_per_h
        return max(self.relative_per_h * abs(mean), floor)


@dataclass(frozen=True)
class Growth:
    """One resource over the samples after warm-up."""

    name: str
    samples: int
    start: float
    end: float
    low: float
    high: float
    per_hour: float
    """Least-squares slope over every sample after warm-up."""
    last_half_per_hour: float
    """The same over the later half of them: a resource still settling has a smaller one."""
    allowed_per_hour: float

    @property
    def verdict(self) -> str:
        """``flat``; ``settling`` (it moved, but not over the later half); ``GROWS`` or
        ``shrinks`` (over all samples after warm-up and over their later half)."""
        if abs(self.per_hour) <= self.allowed_per_hour:
            return "flat"
        if abs(self.last_half_per_hour) <= self.allowed_per_hour:
            return "settling"
        return "GROWS" if self.per_hour > 0 else "shrinks"


def growth(
    samples: Sequence[Mapping[str, float]], warmup_s: float, tolerance: Tolerance | None = None
) -> list[Growth]:
    """Each resource's growth over the samples taken at or after ``warmup_s``, in name order
    (fields of :data:`NOT_RESOURCES` left out)."""
    tolerance = tolerance or Tolerance()
    series: dict[str, list[tuple[float, float]]] = {}
    for sample in samples:
        t = sample["t_s"]
        if t < warmup_s:
            continue
        for name, value in sample.items():
            if is_resource(name) and math.isfinite(value):
                series.setdefault(name, []).append((t, value))
    out = []
    for name in sorted(series):
        points = series[name]
        values = [v for _, v in points]
        mean = sum(values) / len(values)
        out.append(
            Growth(
                name=name,
                samples=len(points),
                start=values[0],
                end=values[-1],
                low=min(values),
                high=max(values),
                per_hour=slope_per_hour(points),
                last_half_per_hour=slope_per_hour(points[len(points) // 2 :]),
                allowed_per_hour=tolerance.allowed(name, mean),
            )
        )
    return out


def rates(samples: Sequence[Mapping[str, float]], warmup_s: float) -> dict[str, float]:
    """Per second, each count's increase from the first sample at or after ``warmup_s`` to
    the last: the load the growth was measured under."""
    after = [s for s in samples if s["t_s"] >= warmup_s]
    if len(after) < 2 or after[-1]["t_s"] <= after[0]["t_s"]:
        return {}
    first, last = after[0], after[-1]
    elapsed = last["t_s"] - first["t_s"]
    return {
        name[len(COUNTS) :]: (last[name] - first.get(name, 0.0)) / elapsed
        for name in sorted(last)
        if name.startswith(COUNTS)
    }


def human(name: str, value: float) -> str:
    """``value`` in MiB for byte resources, else as a number."""
    if name.endswith("bytes"):
        return f"{value / 2**20:,.2f} MiB"
    return f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:,.1f}"


def table_rows(growths: Sequence[Growth]) -> list[list[str]]:
    """The endurance table (header first): start and end after warm-up, the range, growth
    per hour (all samples after warm-up, and their later half), the tolerance, the verdict."""
    rows = [["resource", "n", "start", "end", "min", "max", "/h", "/h late", "allowed", "verdict"]]
    for g in growths:
        rows.append(
            [
                g.name,
                str(g.samples),
                human(g.name, g.start),
                human(g.name, g.end),
                human(g.name, g.low),
                human(g.name, g.high),
                human(g.name, g.per_hour),
                human(g.name, g.last_half_per_hour),
                human(g.name, g.allowed_per_hour),
                g.verdict,
            ]
        )
    return rows


# ---------------------------------------------------------------------- the samples file


def write_sample(out: IO[str], sample: Mapping[str, float]) -> None:
    """One JSON line, flushed: a run killed half-way keeps every sample taken."""
    out.write(json.dumps(dict(sample), sort_keys=True) + "\n")
    out.flush()


def read_samples(path: Path) -> list[Sample]:
    """The samples of a JSON-lines file (lines that are not samples, such as the run's
    settings line, are skipped)."""
    samples = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            if "t_s" in record:
                samples.append({k: float(v) for k, v in record.items()})
    return samples


def print_report(samples: Sequence[Mapping[str, float]], warmup_s: float) -> None:
    """The endurance table of ``samples`` and the load it was measured under."""
    after = [s for s in samples if s["t_s"] >= warmup_s]
    span_min = (after[-1]["t_s"] - after[0]["t_s"]) / 60 if len(after) > 1 else 0.0
    print(
        f"\nendurance table: {len(after)} samples over {span_min:.1f} min after a "
        f"{warmup_s / 60:g} min warm-up; growth per hour is the least-squares slope over them "
        "('/h late': over their later half)"
    )
    print_rows(table_rows(growth(samples, warmup_s)))
    load = rates(samples, warmup_s)
    if load:
        print(
            "load after warm-up, per second: "
            + ", ".join(f"{name} {value:,.2f}" for name, value in load.items())
        )
