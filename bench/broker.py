"""Broker benchmark: produce throughput and publish-to-receive latency, next to the raw ledger.

A broker runs in a **separate process** (this script started again with a hidden
``--serve-broker`` flag), so the clients' event loop and the broker's do not share a core:
a :class:`~segtxn.broker.app.BrokerServer` on loopback, with a ``memory://`` metadata store
and ``file://`` managed ledgers in a temporary directory created under the repository (the
repository's disk, never tmpfs; removed at the end). The metadata store is the same
``memory://`` kind the raw-ledger rows use, so the comparison is about the broker (WebSocket
frames, de-duplication, entry encoding, receipts), not about etcd. All clients run in this
process, through the public :class:`~segtxn.client.Client`. Messages are 100 B payloads; the
broker stores each as one ledger entry (payload plus producer name, sequence id, publish
time: the entry size is printed).

It measures, for **1 and 8 producers** (each on its own ``persistent://`` topic, so each has
its own ledger, group-commit writer and de-duplication state, and none waits on another's
ordering), each with **batching on and off** (4 configurations):

1. **produce throughput** (msgs/s, MB/s of payload, 10^6 B): every producer keeps up to
   ``max_pending`` = 1000 messages in flight with ``send_async``; a message counts when its
   receipt (durable) arrives inside the measurement window, which starts after a warm-up.
   No subscription exists, so this is the produce path alone. ``avg batch`` is entries per
   ``fdatasync`` in the broker's ledgers (from the topic stats).
2. **saturated publish-to-receive latency**: the same load on fresh topics with one
   Exclusive consumer per topic (from ``earliest``, never acknowledging: acks are not
   measured) receiving in this process. The send time (``perf_counter_ns``) is the first 8
   bytes of the payload, taken just before ``send_async`` (so it includes waiting for room
   in the window); a sample is receive time minus send time, for messages sent inside the
   window. With 1000 in flight this is mostly queueing (Little's law: in-flight / rate).
   The throughput reached with consumers attached is printed next to it.
3. **paced latency**: 1 producer at a fixed ~1000 msgs/s (``asyncio.sleep`` to a schedule)
   with one consumer, batching on and off: send-to-receipt (durable) and publish-to-receive
   p50/p99, i.e. latency when nothing queues.

In the same run, before the broker starts, it measures the **raw ledger** in this process:
a :class:`~segtxn.ledger.ManagedLedger` on :class:`~segtxn.ledger.FileLogStorage` in the
same directory with default :class:`~segtxn.ledger.LedgerSettings` (the broker's), 1000
concurrent ``append`` tasks of 100 B entries per ledger, for 1 ledger and for 8 ledgers
(the shapes of 1 and 8 producers with 1000 in flight each). Each broker row's ``÷ raw`` is
its msgs/s over the appends/s of the raw row with the same number of ledgers: how much of
the ledger's append rate survives the broker and its clients.

Every process of the run (the broker, and this one: the raw ledger and the clients) runs on
the event loop ``--event-loop`` names: ``auto`` (the default, as ``segtxn broker``'s: uvloop
where it is installed), ``uvloop`` or ``asyncio``; it is printed in the first line. Before,
the broker ran on asyncio's loop here and on uvloop in production, so this bench measured a
broker users do not run.

Every measurement is a time-bounded loop (``--seconds`` after a short warm-up). The
machine's cores are shared by the broker process and this one (which runs all producers and
consumers), so read the numbers as side-by-side ratios from one run, not absolute figures.

Run: ``.venv/bin/python bench/broker.py [--seconds S] [--event-loop auto|uvloop|asyncio]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from brokerload import PRODUCERS, WARMUP_S, broker_runs, raw_ledger, stamped
from brokerresults import MAX_PENDING, SIZE, print_tables
from common import collect_as_servers_do, file_ledger_broker, filesystem_of, until_signalled

from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.cli.loops import CHOICES, EventLoop, choose
from segtxn.metastore.etcd_server import free_port

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 30.0


# ---------------------------------------------------------------------- the broker process


async def serve_broker(port: int, ledger_dir: Path) -> None:
    """The broker side (``--serve-broker``): serve until SIGTERM or SIGINT."""
    server = file_ledger_broker(port, ledger_dir)
    await server.start()
    collect_as_servers_do()
    try:
        await until_signalled()
    finally:
        await server.stop()


def wait_ready(process: subprocess.Popen[bytes], url: str) -> None:
    """Poll ``/readyz`` until it answers 200 (bounded)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the broker exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)  # process start-up: nothing to wait on but the port
    raise RuntimeError(f"the broker was not ready within {READY_TIMEOUT_S:g} s")


@contextlib.contextmanager
def broker_process(ledger_dir: Path, loop: EventLoop) -> Iterator[tuple[str, int]]:
    """Run the broker in a child process; yields its URL and pid; stops it (or kills it)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve-broker",
            str(port),
            str(ledger_dir),
            "--event-loop",
            loop.name,
        ]
    )
    try:
        wait_ready(process, url)
        yield url, process.pid
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def stored_entry_size() -> int:
    """Bytes of the ledger entry the broker writes for one 100 B message."""
    message = StoredMessage(
        producer_name="tput-8p-single-7",
        sequence_id=123_456,
        publish_time_ms=int(time.time() * 1000),
        payload=stamped(time.perf_counter_ns()),
    )
    return len(encode_entry(message))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="duration of each measurement (default 2)"
    )
    parser.add_argument(
        "--event-loop",
        choices=CHOICES,
        default="auto",
        help="the event loop of every process (default auto: uvloop where installed)",
    )
    parser.add_argument("--serve-broker", nargs=2, metavar=("PORT", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    loop = choose(args.event_loop)
    if args.serve_broker:
        port, ledger_dir = args.serve_broker
        with asyncio.Runner(loop_factory=loop.factory) as runner:
            runner.run(serve_broker(int(port), Path(ledger_dir)))
        return 0
    seconds: float = args.seconds

    started = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix=".bench-ledger-broker-", dir=REPO))
    try:
        print(
            f"segtxn broker bench: {seconds:g} s per measurement after {WARMUP_S:g} s warm-up, "
            f"{os.cpu_count()} CPUs, {loop.name} event loop, "
            f"files in {directory} ({filesystem_of(directory)}); "
            f"{SIZE} B messages, stored as {stored_entry_size()} B entries by the broker"
        )
        with asyncio.Runner(loop_factory=loop.factory) as runner:
            raw = {n: runner.run(raw_ledger(directory, n, MAX_PENDING, seconds)) for n in PRODUCERS}
            with broker_process(directory / "broker", loop) as (url, pid):
                saturated_rows, paced_rows = runner.run(broker_runs(url, pid, seconds))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print()
    print_tables(raw, saturated_rows, paced_rows)
    print(f"\ntotal run time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
