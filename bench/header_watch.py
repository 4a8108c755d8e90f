"""Header-watch bench: how many transaction header changes each broker's cache processes,
with ``--header-watch prefix`` and with ``scoped``, on a cluster of two brokers where every
transaction touches only broker A's segments.

For each mode, in its own private etcd (fsync off: this counts events, it does not time the
disk), it starts broker A and a coordinator as separate processes, creates a topic of four
segments (all on A, the only broker then), then starts broker B, which serves nothing. It
runs ``--count`` transactions, each sending one message to every segment and committing,
waits until A has materialized them (its point watches back to 0 in scoped mode, and both
brokers' counts still), and reads from each broker's ``/metrics``:

- ``segtxn_txn_header_events_total``: header changes its watch delivered and decoded;
- ``segtxn_txn_header_point_watches``: point watches open at the end (scoped mode);
- ``segtxn_broker_active_segments``: to show B served none of the segments.

It also prints the transactions' wall time per mode: in scoped mode a transaction's first
send on A reads its header (prefix mode usually finds it in the watch's recent OPEN headers).

Run: ``PYTHONPATH=. python bench/header_watch.py [--count 200]``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from common import ServerProcess, exit_on_sigterm, print_rows

from segtxn.broker.txn.headers import HeaderWatch
from segtxn.client import Client, ScalableProducer
from segtxn.metastore.etcd_server import EtcdServer

REPO = Path(__file__).resolve().parent.parent
TOPIC = "topic://bench/headers/orders"
SEGMENTS = 4
SETTLE_TIMEOUT_S = 60.0


@dataclass
class Row:
    mode: HeaderWatch
    seconds: float
    a: dict[str, float]
    b: dict[str, float]


def scrape(url: str) -> dict[str, float]:
    """The unlabelled samples of a ``/metrics`` page."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def broker(name: str, store: str, directory: Path, mode: HeaderWatch) -> ServerProcess:
    command = ["broker", "--store", store, "--data-dir", str(directory / name)]
    command += ["--broker-id", name, "--header-watch", mode.value]
    return ServerProcess(f"broker {name}", command, directory / f"{name}.log")


async def create_topic(url: str) -> None:
    async with Client(url) as client:
        await client.admin.create_topic(TOPIC, segments=SEGMENTS)


async def run_transactions(url: str, count: int) -> float:
    """``count`` transactions, each one message on every segment, committed; seconds."""
    async with Client(url) as client:
        producer = await client.create_producer(TOPIC)
        assert isinstance(producer, ScalableProducer)
        keys: dict[int, str] = {}
        i = 0
        while len(keys) < SEGMENTS:
            keys.setdefault(producer.route(f"k{i}"), f"k{i}")
            i += 1
        started = time.perf_counter()
        for n in range(count):
            async with client.transaction() as txn:
                sends = [
                    await producer.send_async(f"m{n}".encode(), key=key, txn=txn)
                    for key in keys.values()
                ]
                await asyncio.gather(*sends)
        return time.perf_counter() - started


def settle(a: ServerProcess, b: ServerProcess) -> tuple[dict[str, float], dict[str, float]]:
    """Both brokers' metrics once A has no point watch left and neither count moves."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last: tuple[float, float] | None = None
    while time.monotonic() < deadline:
        ma, mb = scrape(a.url), scrape(b.url)
        counts = (ma["segtxn_txn_header_events_total"], mb["segtxn_txn_header_events_total"])
        if ma["segtxn_txn_header_point_watches"] == 0 and counts == last:
            return ma, mb
        last = counts
        time.sleep(0.5)  # a scrape interval: what settles is in other processes
    raise RuntimeError(f"the brokers did not settle within {SETTLE_TIMEOUT_S:g} s")


def run_mode(mode: HeaderWatch, count: int, directory: Path) -> Row:
    etcd = EtcdServer.in_temp_dir(unsafe_no_fsync=True)
    etcd.start()
    servers: list[ServerProcess] = []
    try:
        store = etcd.url("/bench")
        a = broker("a", store, directory / mode.value, mode)
        coordinator = ServerProcess(
            "coordinator",
            ["coordinator", "--store", store],
            directory / mode.value / "coordinator.log",
        )
        b = broker("b", store, directory / mode.value, mode)
        (directory / mode.value).mkdir(parents=True)
        servers += [a, coordinator]
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
        asyncio.run(create_topic(a.url))  # all its segments on A, the only broker yet
        servers.append(b)
        b.start()
        b.wait_ready()
        seconds = asyncio.run(run_transactions(a.url, count))
        ma, mb = settle(a, b)
        return Row(mode, seconds, ma, mb)
    finally:
        for server in reversed(servers):
            server.stop()
        etcd.stop()


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=200, help="transactions per mode")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix=".bench-header-watch-", dir=REPO))
    try:
        rows = [run_mode(mode, args.count, directory) for mode in HeaderWatch]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"{args.count} transactions, each one message on each of {SEGMENTS} segments of A")
    table = [["mode", "A events", "B events", "B segments", "A watches", "txn/s"]]
    for row in rows:
        table.append(
            [
                row.mode.value,
                f"{row.a['segtxn_txn_header_events_total']:.0f}",
                f"{row.b['segtxn_txn_header_events_total']:.0f}",
                f"{row.b['segtxn_broker_active_segments']:.0f}",
                f"{row.a['segtxn_txn_header_point_watches']:.0f}",
                f"{args.count / row.seconds:.1f}",
            ]
        )
    print_rows(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
