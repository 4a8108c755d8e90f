"""Replication benchmark (issue 17): what ``--replication 3/2`` costs a producer, and how
long a topic is out of service after its broker is SIGKILLed.

The script starts a private single-member etcd (``EtcdServer.in_temp_dir()``: data on
``/dev/shm`` when it exists, fsync on) and on it **two clusters of three brokers**, each
broker its own process (``python -m segtxn.cli broker``), each cluster under its own
namespace of the store:

* ``unreplicated``: no ``--replication``: each ledger in its owner's files only;
* ``replicated 3/2``: every broker is also a storage node; a new ledger goes to 3 brokers
  (its owner first) and an entry is acknowledged once 2 of them have synced it.

Each cluster also has a transaction coordinator process. The brokers run with
``--session-ttl`` (default 2 s). Every broker's files go to a temporary
``.bench-ledger-replication-*`` directory under the repository (the repository's disk,
never tmpfs; removed at the end). All clients run in this process, through the public
:class:`~segtxn.client.Client`.

**1. Produce throughput and send latency, side by side.** In each of ``--rounds`` rounds,
each load runs on both clusters in turns (unreplicated first in odd rounds, replicated
first in even ones), each time on a fresh ``persistent://`` topic with ``--producers``
producers on it (one topic: one owner, one ledger, and in the replicated cluster its two
replicas on the other brokers), ``--size`` B messages:

* ``one at a time``: each producer sends a message and waits for its receipt before the
  next (one in flight per producer);
* ``pipelined``: each producer keeps up to ``IN_FLIGHT`` messages in flight
  (``send_async``), batching on (messages queued while a frame is written travel in one
  ``SendBatch`` frame).

A message counts when its receipt (stored: fsynced on its owner's disk, or synced by 2 of
its 3 replicas) arrives inside the window (``--seconds`` after a warm-up). Its latency runs
from the ``send_async`` call to the receipt, for messages sent inside the window; pipelined,
that includes waiting for room in the window, so it is mostly queueing (in flight ÷ rate).
msgs/s and p50/p99 pool every round; the ``replicated ÷ unreplicated`` line gives the
ratios: throughput below 1x and latency above 1x is what replication costs (the range is
the throughput ratio's, round by round).

Then, once per round and in turns too, ``bench/txn.py``'s transactional
**consume-transform-produce** loop ((c) there: a 4-segment ``topic://`` pre-filled with
``--ctp-messages`` messages, ``CTP_BATCH`` received, transformed, sent to another
4-segment topic and acknowledged per transaction, committed; each cluster has a
coordinator for it): msgs/s on each cluster and the ratio.

**2. Take-over after a SIGKILL**, on the replicated cluster, ``--trials`` trials, each on
a fresh topic (created with all three brokers up, so its ledger is on all three). In each,
a client that knows only the two brokers that do not own the topic (lookups go through
them; producers and consumers connect to whichever broker owns it) creates a subscription
(at ``latest``) and a producer that sends ``RATE`` msgs/s on a fixed schedule without
waiting for receipts (sends queue up while the topic has no owner and go again after the
reconnect; de-duplication keeps each once). Once ``PRE_KILL_S`` worth of its sends are
acknowledged, right after a send (so one is in flight), the owner is SIGKILLed (t = 0):

* ``first ack``: until the first receipt of a message sent after the kill;
* ``read back``: until a consumer on that subscription, attached after the kill, has
  received every message acknowledged before the kill (the new owner has recovered the
  ledger and the subscription);
* ``take-over``: the later of the two.

Then the producer stops and flushes, and the killed broker is started again on its own data
directory (ready: registered again); the topic stays with its new home (printed). A
take-over is: the session TTL (the dead broker stays registered that long, and the topic
moves on the first lookup after that), the client's retry back-off (doubling up to 1 s for
lookups, 2 s for a producer's reconnect), and the new owner's recovery of the ledger
(fencing its replicas). After the last trial, an end marker is sent to each trial's topic
and a fresh subscription reads it from ``earliest`` up to the marker: every acknowledged
message must be there exactly once, each producer's messages in the order sent, and a send
whose outcome is unknown at most once. Otherwise the script prints what is wrong, keeps the
brokers' logs and files, and exits 1.

``--same-topic`` runs every trial on one topic instead, killing its home of the moment.
It fails at the second trial: the first take-over happens with one broker down, so the new
owner's ledger is created on two brokers only (``ReplicatedLogStorage``: "with fewer nodes
alive it goes on as many as there are"), and it stays on two after the third broker
returns (no ensemble change; a ledger rolls over at 64 MiB). Killing its owner then leaves
one replica, and recovery needs the ack quorum (2) to hold every entry, so no broker can
load the topic until the killed one is back: the trial waits ``6 x TTL + 30`` s and fails.

Percentiles are nearest-rank; over 5 trials the p99 is the slowest trial. etcd, six
brokers, two coordinators and this process share the machine's cores (two where this was
written), so read the ratios from one run, not the absolute figures.

Run: ``.venv/bin/python bench/replication.py [--seconds S] [--rounds R] [--producers P]
[--size B] [--ctp-messages M] [--trials N] [--session-ttl S] [--same-topic]`` (defaults:
3 s windows, 2 rounds, 4 producers, 100 B, 2000 messages, 5 trials, 2 s TTL: about 1.5
minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import exit_on_sigterm, filesystem_of
from replclusters import BROKERS, REPLICATION, Cluster, Settings, clusters
from replload import LoadResult, ctp_rounds, load_rounds, print_load
from takeover import Trial, Verdict, print_takeover, takeover_trials

REPO = Path(__file__).resolve().parent.parent


async def run_all(
    plain: Cluster, replicated: Cluster, settings: Settings
) -> tuple[list[tuple[LoadResult, LoadResult]], list[Trial], Verdict]:
    pairs = await load_rounds(plain, replicated, settings)
    ctp = await ctp_rounds(plain, replicated, settings)
    print_load(pairs, ctp, settings)
    print(flush=True)
    trials, verdict = await takeover_trials(replicated, settings)
    return pairs, trials, verdict


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="length of each load window (default 3)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="load rounds (default 2)")
    parser.add_argument("--producers", type=int, default=4, help="producers (default 4)")
    parser.add_argument("--size", type=int, default=100, help="message bytes (default 100)")
    parser.add_argument("--trials", type=int, default=5, help="take-over trials (default 5)")
    parser.add_argument(
        "--session-ttl", type=float, default=2.0, help="brokers' session TTL, s (default 2)"
    )
    parser.add_argument(
        "--ctp-messages",
        type=int,
        default=2000,
        help="messages per transactional consume-transform-produce run (0: none; default 2000)",
    )
    parser.add_argument(
        "--same-topic",
        action="store_true",
        help="every take-over trial on one topic (see the module docstring: it fails)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.producers < 1 or args.size < 1 or args.trials < 1:
        parser.error("--rounds, --producers, --size and --trials must be at least 1")
    if args.ctp_messages < 0:
        parser.error("--ctp-messages must be at least 0")
    settings = Settings(
        seconds=args.seconds,
        rounds=args.rounds,
        producers=args.producers,
        size=args.size,
        trials=args.trials,
        session_ttl_s=args.session_ttl,
        ctp_messages=args.ctp_messages,
        same_topic=args.same_topic,
    )

    started = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix=".bench-ledger-replication-", dir=REPO))
    failed = True  # until the run ends without an error
    try:
        print(
            f"segtxn replication bench: {os.cpu_count()} CPUs; etcd single member, fsync on; "
            f"two clusters of {BROKERS} brokers in their own processes (unreplicated, and "
            f"--replication {REPLICATION}), session TTL {settings.session_ttl_s:g} s; ledgers "
            f"in {directory} ({filesystem_of(directory)})",
            flush=True,
        )
        with clusters(directory, settings.session_ttl_s) as (plain, replicated):
            _, trials, verdict = asyncio.run(run_all(plain, replicated, settings))
        failed = bool(verdict.problems)
    finally:
        if failed:
            print(f"the brokers' logs and files are kept in {directory}", file=sys.stderr)
        else:
            shutil.rmtree(directory, ignore_errors=True)
    print()
    print_takeover(trials, verdict, settings)
    print(f"\ntotal run time: {time.perf_counter() - started:.1f} s")
    return 1 if verdict.problems else 0


if __name__ == "__main__":
    sys.exit(main())
