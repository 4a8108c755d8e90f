"""Endurance run: a steady transactional load for hours, and each resource's growth per hour.

Issue 22 asks that segtxn run for months with every log, index, cache and store flat under a
steady load. This run measures it. It starts a private single-member etcd (fsync on, data on
``/dev/shm`` when it exists, auto-compaction as ``segtxn`` sets it: periodic, 5 minutes),
one broker and one v5 coordinator, each its own process, and drives through the public
client, for ``--warmup`` + ``--duration`` seconds:

* **plain sends**: a feeder sends ``--rate`` messages a second (``--payload`` bytes, keys
  from a fixed set) to ``input``, a ``topic://`` of ``--segments`` segments;
* **consume-transform-produce in transactions**: a processor takes up to ``--batch`` inputs
  from the ``processors`` subscription (Shared), and in one transaction sends one derived
  message per input to ``output`` and acknowledges the inputs, then commits;
* **a sink** consumes ``output`` (Shared) and acknowledges every message, so both topics are
  consumed and retention can delete their ledgers;
* **topology changes**: every ``--change-every`` seconds a split or a merge, in turn on
  ``input`` and ``output`` (split input, split output, merge input, merge output, ...), so
  the DAG keeps changing while the number of active segments stays the same.

The load does not grow by itself: the feeder waits while more than ``--max-backlog``
messages are sent and not yet processed, the processor has one transaction in flight, the
sink acknowledges what it received before receiving more, and the counts it keeps are ints.

Every ``--sample-every`` seconds it samples, for the broker, the coordinator, etcd and this
process (``load``): RSS and open fds; the broker's ledger bytes on disk and etcd's data
directory; etcd's db size (total and in use), key count and revision from its ``/metrics``;
the keys under segtxn's namespace, in total and per top-level group (one keys-only range);
the broker's topics loaded, active segments, backlog, producers and consumers; and the
load's counts. Each sample is one JSON line in ``--out`` (the first line holds the run's
settings), so a run can be plotted later, and one line on the terminal. At the end it prints
the endurance table: per resource, its values after warm-up and its least-squares growth per
hour (``bench/growth.py``), with a verdict (docs/verification.md, "Endurance run").

The broker runs from this script (``--serve-broker``) rather than ``segtxn broker`` so its
ledgers roll over at ``--ledger-mib`` (the product's 64 MiB would take hours per segment at
this rate, and retention deletes only closed ledgers) and retention runs every
``--retention-check`` seconds, deleting consumed ledgers ``--retention-time`` seconds after
they closed: within a run, trimming happens many times; and sealed segments consumed and
past retention are retired every ``--retire-check`` seconds (the product's default is 10
minutes). The private etcd is defragmented (one log line each time) when ``--defrag-min-free-mib``
of its file are free, checked every ``--defrag-check`` seconds, as ``segtxn store defrag``
would. Child processes import the segtxn
this script sits next to (its directory is put first on ``PYTHONPATH``).

Run: ``.venv/bin/python bench/endurance.py [--duration 3600] [--warmup 600]
[--sample-every 60] [--out endurance.jsonl] [--rate 200] [--change-every 180]
[--retire-check 120]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common import ServerProcess, collect_as_servers_do, exit_on_sigterm, until_signalled
from endurance_load import Counts, Load, Settings
from growth import (
    BROKER_GAUGES,
    ETCD_METRICS,
    Sample,
    dir_bytes,
    fill_groups,
    print_report,
    process_sample,
    read_samples,
    scrape,
    store_keys,
    write_sample,
)

import segtxn
from segtxn.metastore.defrag import MIB, DefragSettings, run_defragmentation
from segtxn.metastore.etcd_server import EtcdServer

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "/endurance"

# ---------------------------------------------------------------------- the cluster


class BrokerProcess(ServerProcess):
    """This script with ``--serve-broker``: a broker with the run's ledger and retention
    settings (``segtxn broker`` has no flag for the ledger size or the retention period)."""

    def __init__(self, directory: Path, store_url: str, settings: Settings) -> None:
        super().__init__("broker", [], directory / "broker.log")
        self.ledger_dir = directory / "ledgers"
        self._command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve-broker",
            json.dumps(
                {
                    "port": self.port,
                    "store_url": store_url,
                    "ledger_dir": str(self.ledger_dir),
                    "ledger_bytes": int(settings.ledger_mib * 2**20),
                    "retention_time_s": settings.retention_time_s,
                    "retention_check_s": settings.retention_check_s,
                    "retire_check_s": settings.retire_check_s,
                }
            ),
        ]


async def serve_broker(spec: dict[str, Any]) -> None:
    """``--serve-broker SPEC``: one broker until SIGTERM or SIGINT."""
    from segtxn.broker.app import BrokerServer
    from segtxn.broker.settings import BrokerSettings
    from segtxn.ledger import LedgerSettings, RetentionPolicy

    port = int(spec["port"])
    broker = BrokerServer(
        BrokerSettings(
            broker_id="e1",
            advertise_url=f"http://127.0.0.1:{port}",
            store_url=spec["store_url"],
            ledger_url=f"file://{spec['ledger_dir']}",
            ledger=LedgerSettings(max_ledger_bytes=int(spec["ledger_bytes"])),
            retention=RetentionPolicy(retention_time_s=float(spec["retention_time_s"])),
            retention_check_s=float(spec["retention_check_s"]),
            retire_check_s=float(spec["retire_check_s"]),
        ),
        host="127.0.0.1",
        port=port,
    )
    await broker.start()
    collect_as_servers_do()
    try:
        await until_signalled()
    finally:
        await broker.stop()


@dataclass
class Cluster:
    etcd: EtcdServer
    broker: BrokerProcess
    coordinator: ServerProcess

    def pids(self) -> dict[str, int | None]:
        def pid(p: Any) -> int | None:
            return None if p.process is None else int(p.process.pid)

        return {
            "broker": pid(self.broker),
            "coordinator": pid(self.coordinator),
            "etcd": pid(self.etcd),
            "load": os.getpid(),
        }

    def check_alive(self) -> None:
        """Raise RuntimeError if a server has exited (the run is then meaningless)."""
        for server in (self.broker, self.coordinator):
            assert server.process is not None
            if server.process.poll() is not None:
                raise RuntimeError(f"the {server.name} exited: {server.tail()}")
        assert self.etcd.process is not None
        if self.etcd.process.poll() is not None:
            raise RuntimeError("etcd exited")


@contextlib.contextmanager
def cluster(directory: Path, settings: Settings) -> Iterator[Cluster]:
    etcd = EtcdServer.in_temp_dir()
    etcd.start()
    servers: list[ServerProcess] = []
    try:
        store = etcd.url(NAMESPACE)
        broker = BrokerProcess(directory, store, settings)
        coordinator = ServerProcess(
            "coordinator",
            ["coordinator", "--store", store, "--gc-retention", str(settings.gc_retention_s)],
            directory / "coordinator.log",
        )
        servers += [broker, coordinator]
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
        yield Cluster(etcd, broker, coordinator)
    finally:
        for server in reversed(servers):
            server.stop()
        etcd.stop()


# ---------------------------------------------------------------------- the load


# ---------------------------------------------------------------------- sampling


def take_sample(c: Cluster, t_s: float, counts: Counts, key_depth: int) -> Sample:
    """Every resource now (blocking: run it in a thread)."""
    sample: Sample = {"t_s": round(t_s, 3)}
    for name, pid in c.pids().items():
        sample |= process_sample(name, pid)
    sample["broker.ledger_bytes"] = float(dir_bytes(c.broker.ledger_dir))
    sample["etcd.dir_bytes"] = float(dir_bytes(c.etcd.data_dir))
    with contextlib.suppress(OSError):
        sample |= scrape(f"http://{c.etcd.endpoint}/metrics", ETCD_METRICS)
    with contextlib.suppress(OSError):
        sample |= scrape(f"{c.broker.url}/metrics", BROKER_GAUGES, prefix="broker.")
    with contextlib.suppress(Exception):  # grpc's errors: a missing sample, not a failed run
        sample |= store_keys(c.etcd.endpoint, NAMESPACE, key_depth)
    return sample | counts.sample()


def progress_line(s: Sample) -> str:
    def mib(name: str) -> str:
        return f"{s[name] / 2**20:.1f}" if name in s else "-"

    return (
        f"  t={s['t_s'] / 60:6.1f} min  rss MiB broker {mib('broker.rss_bytes')} coord "
        f"{mib('coordinator.rss_bytes')} etcd {mib('etcd.rss_bytes')} load "
        f"{mib('load.rss_bytes')}  ledgers {mib('broker.ledger_bytes')} MiB  db "
        f"{mib('etcd.db_bytes')} MiB  keys {s.get('store.keys', 0):.0f}  processed "
        f"{s['count.processed']:.0f}  failed txns {s['count.failed_txns']:.0f}  changes "
        f"{s['count.changes']:.0f}"
    )


async def sample_until_done(c: Cluster, load: Load, out: Any) -> list[Sample]:
    """A sample every ``sample_every_s`` from the load's start to warm-up + duration (both
    ends included), then stop the load."""
    settings = load.settings
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = settings.warmup_s + settings.duration_s
    samples: list[Sample] = []
    groups: set[str] = set()
    k = 0
    try:
        while True:
            t = min(k * settings.sample_every_s, end)
            await asyncio.sleep(max(0.0, start + t - loop.time()))  # the sampling clock
            c.check_alive()
            sample = await asyncio.to_thread(
                take_sample, c, loop.time() - start, load.counts, settings.key_depth
            )
            fill_groups(sample, groups)
            samples.append(sample)
            write_sample(out, sample)
            print(progress_line(sample), flush=True)
            if t >= end:
                return samples
            k += 1
    finally:
        load.stop.set()


async def endure(c: Cluster, settings: Settings, out: Any) -> list[Sample]:
    load = Load(c.broker.url, settings)
    defrag = DefragSettings(
        min_free_bytes=settings.defrag_min_free_mib * MIB,
        check_s=settings.defrag_check_s if settings.defrag_min_free_mib else 0.0,
    )
    defragmenting = asyncio.create_task(
        run_defragmentation([c.etcd.endpoint], defrag), name="etcd-defragmentation"
    )
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(load.run(), name="load")
            sampled = tasks.create_task(sample_until_done(c, load, out), name="sample")
    finally:
        defragmenting.cancel()
        await asyncio.gather(defragmenting, return_exceptions=True)
    return sampled.result()


# ---------------------------------------------------------------------- driver


def parse(argv: list[str] | None) -> tuple[Settings, Path, Path | None]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    arg = parser.add_argument
    arg("--duration", type=float, default=3600.0, help="seconds of load after warm-up")
    arg("--warmup", type=float, default=600.0, help="seconds of load before the slopes start")
    arg("--sample-every", type=float, default=60.0, help="seconds between samples")
    arg("--rate", type=float, default=200.0, help="plain sends a second to input")
    arg("--batch", type=int, default=20, help="inputs per transaction (at most)")
    arg("--max-backlog", type=int, default=2000, help="sent, not processed: the feeder waits")
    arg("--change-every", type=float, default=180.0, help="seconds between splits/merges")
    arg("--segments", type=int, default=4, help="segments of each topic at the start")
    arg("--payload", type=int, default=100, help="bytes per message")
    arg("--ledger-mib", type=float, default=1.0, help="roll a ledger over at this size")
    arg("--retention-time", type=float, default=60.0, help="keep consumed ledgers this long")
    arg("--retention-check", type=float, default=15.0, help="seconds between retention passes")
    arg(
        "--retire-check",
        type=float,
        default=120.0,
        help="seconds between sweeps retiring consumed sealed segments (the product's: 600)",
    )
    arg("--gc-retention", type=float, default=60.0, help="coordinator's header GC retention")
    arg(
        "--defrag-min-free-mib",
        type=int,
        default=32,
        help="defragment etcd once this many MiB of its file are free (0: never)",
    )
    arg("--defrag-check", type=float, default=300.0, help="seconds between defrag checks")
    arg("--key-depth", type=int, default=1, help="path components to group store keys by")
    arg("--out", type=Path, default=None, help="samples file (JSON lines; default: a new one)")
    arg("--report", type=Path, default=None, help="only print the table of a samples file")
    arg("--serve-broker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_broker is not None:
        spec = json.loads(args.serve_broker)
        Path(spec["ledger_dir"]).mkdir(parents=True, exist_ok=True)
        asyncio.run(serve_broker(spec))
        sys.exit(0)
    settings = Settings(
        duration_s=args.duration,
        warmup_s=args.warmup,
        sample_every_s=args.sample_every,
        rate_per_s=args.rate,
        batch=args.batch,
        max_backlog=args.max_backlog,
        change_every_s=args.change_every,
        segments=args.segments,
        payload_bytes=args.payload,
        ledger_mib=args.ledger_mib,
        retention_time_s=args.retention_time,
        retention_check_s=args.retention_check,
        retire_check_s=args.retire_check,
        gc_retention_s=args.gc_retention,
        key_depth=args.key_depth,
        defrag_min_free_mib=args.defrag_min_free_mib,
        defrag_check_s=args.defrag_check,
    )
    out = args.out or REPO / f".endurance-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    return settings, out, args.report


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("segtxn.metastore.defrag").setLevel(logging.INFO)  # each defrag: a line
    settings, out_path, report_of = parse(argv)
    if report_of is not None:
        settings_line = json.loads(report_of.read_text().splitlines()[0])
        print_report(read_samples(report_of), float(settings_line["settings"]["warmup_s"]))
        return 0
    # the servers must run the segtxn next to this script, whatever is installed
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *(p for p in paths if p != str(REPO))])
    if Path(segtxn.__file__).resolve().parent != REPO / "segtxn":
        raise SystemExit(f"this imports {segtxn.__file__}, not {REPO}: set PYTHONPATH={REPO}")
    directory = Path(tempfile.mkdtemp(prefix=".endurance-data-", dir=REPO))
    print(
        f"segtxn endurance run: {os.cpu_count()} CPUs, {settings.warmup_s:g} s warm-up + "
        f"{settings.duration_s:g} s, a sample every {settings.sample_every_s:g} s to {out_path}"
    )
    print(f"settings: {asdict(settings)}")
    try:
        with cluster(directory, settings) as c, open(out_path, "w", encoding="utf-8") as out:
            out.write(json.dumps({"settings": asdict(settings), "segtxn": str(REPO)}) + "\n")
            print(f"ledgers in {c.broker.ledger_dir}, etcd data in {c.etcd.data_dir}", flush=True)
            samples = asyncio.run(endure(c, settings, out))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print_report(samples, settings.warmup_s)
    print(f"samples: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
