"""Managed-ledger append benchmark next to the disk's own write+fdatasync limits.

Through the public :class:`~segtxn.ledger.ManagedLedger` API on a
:class:`~segtxn.ledger.FileLogStorage` (so CRC framing, the group-commit writer, its
worker-thread hop and the ``fdatasync`` per batch are all included), it measures, for 1, 16
and 256 concurrent appenders, each with 100 B and 10 KiB entries (6 configurations):

- **appends/s** and **MB/s** (payload bytes, 10^6 B): completed appends over the wall time
  of N asyncio tasks, each looping ``await ledger.append(...)`` until the deadline;
- **p50 / p99 append latency**: ``time.perf_counter`` around each ``append()`` call, until it
  returned (durable);
- **average batch**: entries per synced batch (``stats.entries / stats.batches``) - how many
  appends shared one ``fdatasync``.

In the same run, in the same directory, it measures the physical limits for each entry
size:

- **plain**: a loop of ``os.write(fd, one record)`` + ``os.fdatasync(fd)`` (writes/s);
- **batched**: the same with ``BATCH`` records concatenated per write + ``fdatasync``
  (records/s and fsyncs/s).

Each ledger row is then divided by both: ``÷ plain`` (how far group commit takes appends
past one fsync per entry) and ``÷ batched`` (how close the ledger gets to what the disk does
with the same entries in ideal batches). Each configuration uses a fresh ledger with a
distinct name. The files live in a temporary directory created under the repository (so on
the repository's disk, never tmpfs) and removed at the end. Every measurement is a
time-bounded loop (``--seconds``). The numbers depend on the machine and its disk, so read
them as side-by-side ratios from one run, not as absolute figures.

Run: ``.venv/bin/python bench/ledger.py [--seconds S]``.

``--ack-marks [--rounds R]`` measures instead what the acknowledgement marks cost (one
small ``write`` after each batch's ``fdatasync``, segtxn/ledger/records.py): for each
configuration, ``R`` pairs of runs, one with marks and one without (a log class that skips
the mark), back to back in alternating order in the same directory; it reports the median
of the pairs' ratios (a busy machine's fsync times drift more between minutes than between
two neighbouring runs) and the time spent in the mark writes themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import filesystem_of, percentile, print_rows

from segtxn.ledger import FileLogStorage, LedgerSettings, ManagedLedger
from segtxn.ledger.files import FileEntryLog
from segtxn.metastore import open_store

REPO = Path(__file__).resolve().parent.parent
CONCURRENCY = (1, 16, 256)
SIZES: dict[str, int] = {"100 B": 100, "10 KiB": 10 * 1024}
BATCH = 64
WARMUP_APPENDS = 20
SETTINGS = LedgerSettings(max_ledger_bytes=256 * 1024 * 1024)


@dataclass
class DiskLimit:
    """One physical-limit loop: ``records`` written in ``fsyncs`` write+fdatasync calls."""

    size: int
    per_fsync: int
    records: int
    fsyncs: int
    elapsed: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed

    @property
    def fsyncs_per_s(self) -> float:
        return self.fsyncs / self.elapsed


@dataclass
class LedgerResult:
    """One ledger configuration: latencies in seconds."""

    appenders: int
    size_label: str
    size: int
    appends: int
    elapsed: float
    p50: float
    p99: float
    entries: int
    batches: int

    @property
    def appends_per_s(self) -> float:
        return self.appends / self.elapsed

    @property
    def mb_per_s(self) -> float:
        return self.appends_per_s * self.size / 1e6

    @property
    def avg_batch(self) -> float:
        return self.entries / self.batches if self.batches else 0.0


def disk_limit(directory: Path, name: str, size: int, per_fsync: int, seconds: float) -> DiskLimit:
    """Append ``per_fsync`` records of ``size`` bytes per write + fdatasync until the deadline."""
    data = b"x" * (size * per_fsync)
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.fsync(fd)
        fsyncs = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fdatasync(fd)
            fsyncs += 1
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return DiskLimit(size, per_fsync, fsyncs * per_fsync, fsyncs, elapsed)


class _NoMarks(FileEntryLog):
    """The log as it was before acknowledgement marks: the baseline of ``--ack-marks``."""

    def _mark(self, nonce: int, offset: int, entries: int) -> int:
        return offset


class _TimedMarks(FileEntryLog):
    """Marks as usual, timing each (the direct cost, free of the disk's noise)."""

    seconds = 0.0
    count = 0

    def _mark(self, nonce: int, offset: int, entries: int) -> int:
        start = time.perf_counter()
        try:
            return super()._mark(nonce, offset, entries)
        finally:
            _TimedMarks.seconds += time.perf_counter() - start
            _TimedMarks.count += 1


class _NoMarksStorage(FileLogStorage):
    entry_log = _NoMarks


class _TimedMarksStorage(FileLogStorage):
    entry_log = _TimedMarks


async def ledger_run(
    directory: Path,
    appenders: int,
    size_label: str,
    size: int,
    seconds: float,
    *,
    marks: bool = True,
    tag: str = "",
) -> LedgerResult:
    """``appenders`` tasks appending ``size``-byte entries to a fresh ledger until the deadline."""
    store = open_store("memory://")
    storage = (_TimedMarksStorage if marks else _NoMarksStorage)(directory / "ledgers")
    name = f"bench-{appenders}x{size}{tag}"
    payload = b"p" * size
    try:
        ledger = await ManagedLedger.open(name, store, storage, SETTINGS)
        try:
            for _ in range(WARMUP_APPENDS):  # code paths, the file's first blocks
                await ledger.append(payload)
            entries0, batches0 = ledger.stats.entries, ledger.stats.batches
            latencies: list[float] = []
            start = time.perf_counter()
            deadline = start + seconds

            async def worker() -> None:
                while time.perf_counter() < deadline:
                    t0 = time.perf_counter()
                    await ledger.append(payload)
                    latencies.append(time.perf_counter() - t0)

            async with asyncio.TaskGroup() as tg:
                for _ in range(appenders):
                    tg.create_task(worker())
            elapsed = time.perf_counter() - start
            entries = ledger.stats.entries - entries0
            batches = ledger.stats.batches - batches0
        finally:
            await ledger.close()
    finally:
        await store.close()
    latencies.sort()
    return LedgerResult(
        appenders=appenders,
        size_label=size_label,
        size=size,
        appends=len(latencies),
        elapsed=elapsed,
        p50=percentile(latencies, 50),
        p99=percentile(latencies, 99),
        entries=entries,
        batches=batches,
    )


def print_tables(
    plain: dict[int, DiskLimit], batched: dict[int, DiskLimit], results: list[LedgerResult]
) -> None:
    disk_rows: list[tuple[str, ...]] = [
        ("disk limit", "entry", "records/s", "fsyncs/s", "MB/s", "records/fsync")
    ]
    for label, size in SIZES.items():
        for mode, lim in (("plain write+fdatasync", plain[size]), ("batched", batched[size])):
            disk_rows.append(
                (
                    mode,
                    label,
                    f"{lim.records_per_s:,.0f}",
                    f"{lim.fsyncs_per_s:,.0f}",
                    f"{lim.records_per_s * size / 1e6:,.1f}",
                    str(lim.per_fsync),
                )
            )
    print_rows(disk_rows, left=2)
    print()
    rows: list[tuple[str, ...]] = [
        (
            "appenders",
            "entry",
            "appends/s",
            "MB/s",
            "p50 ms",
            "p99 ms",
            "avg batch",
            "÷ plain",
            "÷ batched",
        )
    ]
    for r in results:
        rows.append(
            (
                str(r.appenders),
                r.size_label,
                f"{r.appends_per_s:,.0f}",
                f"{r.mb_per_s:,.1f}",
                f"{r.p50 * 1000:.3f}",
                f"{r.p99 * 1000:.3f}",
                f"{r.avg_batch:.1f}",
                f"{r.appends_per_s / plain[r.size].records_per_s:.2f}x",
                f"{r.appends_per_s / batched[r.size].records_per_s:.2f}x",
            )
        )
    print_rows(rows, left=2)
    print(
        f"(÷ plain: appends/s over plain write+fdatasync writes/s; ÷ batched: over records/s "
        f"with {BATCH} records per fdatasync; same entry size, same directory)"
    )


def ack_marks(directory: Path, seconds: float, rounds: int) -> None:
    """Marks against no marks: ``rounds`` pairs of runs per configuration, the two runs of
    a pair back to back (in alternating order), so both see the same background load."""
    rows: list[tuple[str, ...]] = [
        ("appenders", "entry", "appends/s marks", "no marks", "paired ratio", "p50 ratio",
         "p99 ratio", "mark µs", "mark share")
    ]  # fmt: skip
    for appenders in CONCURRENCY:
        for label, size in SIZES.items():
            pairs: list[dict[bool, LedgerResult]] = []
            _TimedMarks.seconds, _TimedMarks.count = 0.0, 0
            elapsed_with_marks = 0.0
            for round_ in range(rounds):
                pair: dict[bool, LedgerResult] = {}
                for marks in (True, False) if round_ % 2 == 0 else (False, True):
                    run = ledger_run(
                        directory, appenders, label, size, seconds, marks=marks,
                        tag=f"-{round_}-{int(marks)}",
                    )  # fmt: skip
                    pair[marks] = asyncio.run(run)
                elapsed_with_marks += pair[True].elapsed
                pairs.append(pair)

            def median(values: list[float]) -> float:
                return sorted(values)[len(values) // 2]

            ratio = median([p[True].appends_per_s / p[False].appends_per_s for p in pairs])
            rows.append(
                (
                    str(appenders),
                    label,
                    f"{median([p[True].appends_per_s for p in pairs]):,.0f}",
                    f"{median([p[False].appends_per_s for p in pairs]):,.0f}",
                    f"{ratio:.3f}",
                    f"{median([p[True].p50 / p[False].p50 for p in pairs]):.3f}",
                    f"{median([p[True].p99 / p[False].p99 for p in pairs]):.3f}",
                    f"{1e6 * _TimedMarks.seconds / max(1, _TimedMarks.count):.1f}",
                    f"{100 * _TimedMarks.seconds / elapsed_with_marks:.2f}%",
                )
            )
            print(f"  {appenders} x {label}: {rows[-1][4]}", flush=True)
    print()
    print_rows(rows, left=2)
    print(
        f"({rounds} pairs of {seconds:g} s runs per row, with and without marks back to back; "
        "ratios are medians over the pairs of with/without: appends/s below 1 is a cost, "
        "latency above 1 is. mark µs: the mark write per batch; mark share: the time spent "
        "writing marks over the runs' wall time, the most it can take from one writer)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="duration of each measurement (default 2)"
    )
    parser.add_argument(
        "--ack-marks",
        action="store_true",
        help="measure the acknowledgement marks: with and without, side by side",
    )
    parser.add_argument(
        "--rounds", type=int, default=12, help="pairs of runs (with --ack-marks; default 12)"
    )
    args = parser.parse_args(argv)
    seconds: float = args.seconds
    if args.ack_marks:
        directory = Path(tempfile.mkdtemp(prefix=".bench-marks-", dir=REPO))
        try:
            print(
                f"ack marks: {args.rounds} pairs of {seconds:g} s runs, {os.cpu_count()} CPUs, "
                f"files in {directory} ({filesystem_of(directory)})"
            )
            ack_marks(directory, seconds, args.rounds)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return 0

    started = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix=".bench-ledger-", dir=REPO))
    try:
        print(
            f"segtxn ledger bench: {seconds:g} s per measurement, {os.cpu_count()} CPUs, "
            f"files in {directory} ({filesystem_of(directory)})"
        )
        plain: dict[int, DiskLimit] = {}
        batched: dict[int, DiskLimit] = {}
        for size in SIZES.values():
            plain[size] = disk_limit(directory, f"plain-{size}.dat", size, 1, seconds)
            batched[size] = disk_limit(directory, f"batched-{size}.dat", size, BATCH, seconds)
        results: list[LedgerResult] = []
        for appenders in CONCURRENCY:
            for label, size in SIZES.items():
                results.append(asyncio.run(ledger_run(directory, appenders, label, size, seconds)))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print()
    print_tables(plain, batched, results)
    print(f"\ntotal run time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
