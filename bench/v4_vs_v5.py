"""v4 (PIP-31 markers) against v5 (PIP-471 metadata) transactions, side by side in one run.

One broker and one coordinator (v5 ids and v4 ids with a transaction log) in this process,
on the embedded metadata store, ledgers in a temporary directory on the repository's disk
(fsync on). Clients are the public :class:`~segtxn.client.Client`.

(a) **END_TXN latency** with 1, 8, 64 participants: each transaction writes one message to
    each of N topics (v4: N ``persistent://`` topics; v5: N one-segment ``topic://``
    topics); the timer covers ``commit()`` alone. v4 logs COMMITTING, calls every
    participant's broker (which appends a marker), logs COMMITTED; v5 is one CAS.
(b) **commit on a sealed segment / terminated topic**: a transaction writes, the topic (v4)
    or the segment (v5) is terminated, then ``commit()``: time to its outcome. v4 cannot
    write the marker and fails; v5 materializes without a write.
(c) **load time of 1,000 persistent topics without transactional messages** (20 plain
    messages each), after a broker restart: with PIP-373 (``__contains_txn_messages=false``:
    no snapshot, no replay) and without (the property set to a non-boolean value, which
    makes the buffer rebuild as a pre-PIP-373 broker does: snapshot lookup and replay).
(d) **load time of one topic with 100,000 historical transactions** (one message and one
    commit marker each, written straight into the ledger as a broker would have): v4
    replays them (here without a snapshot, as after the first load of an upgraded topic);
    a v5 segment with 100,000 historical transactional entries (decided, op records
    cleaned, resolved watermark at the end) loads with no replay.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import msgspec
from common import exit_on_sigterm, percentile, print_rows

from segtxn.broker.app import BrokerServer
from segtxn.broker.entry import StoredMessage, encode_entry, marker_entry
from segtxn.broker.settings import BrokerSettings
from segtxn.broker.txn.buffer_records import STATE, BufferState
from segtxn.broker.txn.markers import CONTAINS_TXN, MarkerTransactionBuffer
from segtxn.client import Client
from segtxn.coordinator.app import CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.ledger import ManagedLedger, open_log_storage
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import free_port
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import V5_COORDINATOR_BASE

REPO = Path(__file__).resolve().parents[1]


class Servers:
    def __init__(self, directory: Path) -> None:
        self.store: MetadataStore = open_store("memory://")
        port = free_port()
        self.settings = BrokerSettings(
            broker_id="b1",
            advertise_url=f"http://127.0.0.1:{port}",
            ledger_url=f"file://{directory / 'ledgers'}",
            txn_buffer_snapshot_every=1_000_000,  # (d) measures a replay without snapshots
        )
        self.broker = BrokerServer(self.settings, store=self.store)
        self.coordinator = CoordinatorServer(
            CoordinatorSettings(
                advertise_url=f"http://127.0.0.1:{free_port()}",
                v4_coordinator_ids=2,
                ledger_url=f"file://{directory / 'txn-logs'}",
                fan_out_timeout_s=2.0,
            ),
            store=self.store,
        )

    @property
    def url(self) -> str:
        return self.settings.advertise_url

    async def start(self) -> None:
        await self.broker.start()
        await self.coordinator.start()

    async def restart_broker(self) -> None:
        await self.broker.stop()
        self.broker = BrokerServer(self.settings, store=self.store)
        await self.broker.start()

    async def stop(self) -> None:
        await self.coordinator.stop()
        await self.broker.stop()
        await self.store.close()


async def end_txn(client: Client, topics: list[str], count: int) -> list[float]:
    producers = [await client.create_producer(t) for t in topics]
    samples = []
    for i in range(count):
        txn = client.transaction()
        await asyncio.gather(*(p.send(b"x", key=f"k{i}", txn=txn) for p in producers))
        started = time.perf_counter()
        await txn.commit()
        samples.append(time.perf_counter() - started)
    for producer in producers:
        await producer.close()
    return samples


async def sealed_commit(client: Client, v4: bool) -> tuple[str, float]:
    topic = "persistent://bench/sealed/t" if v4 else "topic://bench/sealed/t"
    await client.admin.create_topic(topic)
    producer = await client.create_producer(topic)
    txn = client.transaction()
    await producer.send(b"x", key="k", txn=txn)
    await producer.close()
    await client.admin.terminate(topic if v4 else "segment://bench/sealed/t/0")
    started = time.perf_counter()
    try:
        await txn.commit()
        outcome = "COMMITTED"
    except Exception as e:
        outcome = f"failed: {getattr(e, 'name', type(e).__name__)}"
    return outcome, time.perf_counter() - started


async def load_many(servers: Servers, count: int, skip: bool) -> tuple[float, int]:
    """Restart the broker, then load ``count`` topics; returns (seconds, entries replayed)."""
    names = [TopicName.parse(f"persistent://bench/many/t{i}") for i in range(count)]
    if not skip:  # a pre-PIP-373 broker: no trustworthy property, rebuild everything
        for name in names:
            await servers.broker.service.serve(name)
            topic = servers.broker.service.topics[name]
            await topic.ledger.update_properties({CONTAINS_TXN: "unknown"}, ())
    await servers.restart_broker()
    started = time.perf_counter()
    for name in names:
        await servers.broker.service.serve(name)
    elapsed = time.perf_counter() - started
    replayed = 0
    for name in names:
        buffer = servers.broker.service.topics[name].buffer
        assert isinstance(buffer, MarkerTransactionBuffer)
        replayed += buffer.recovery["replayed"]
    return elapsed, replayed


async def fill_many(client: Client, count: int, messages: int) -> None:
    async def one(i: int) -> None:
        topic = f"persistent://bench/many/t{i}"
        await client.admin.create_topic(topic)
        producer = await client.create_producer(topic)
        await asyncio.gather(*(producer.send(b"m" * 100) for _ in range(messages)))
        await producer.close()

    for start in range(0, count, 50):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 50, count))))


async def history(servers: Servers, client: Client, txns: int) -> tuple[float, int, float]:
    """(v4 load s, v4 entries replayed, v5 load s) for ``txns`` historical transactions."""
    v4_topic, v5_topic = "persistent://bench/history/t", "topic://bench/history/t"
    await client.admin.create_topic(v4_topic)
    await client.admin.create_topic(v5_topic)
    segment = TopicName.parse("segment://bench/history/t/0")
    for name in (TopicName.parse(v4_topic), segment):
        await servers.broker.service.serve(name)
    await servers.broker.stop()  # write the history straight into the ledgers
    storage = open_log_storage(servers.settings.ledger_url)
    now = int(time.time() * 1000)
    for ledger_name, v4 in ((v4_topic, True), (str(segment), False)):
        ledger = await ManagedLedger.open(
            ledger_name, servers.store, storage, servers.settings.ledger
        )
        for start in range(0, txns, 5000):
            batch = []
            for least in range(start, min(start + 5000, txns)):
                txn = (0, least) if v4 else (V5_COORDINATOR_BASE, least)
                batch.append(
                    ledger.append(encode_entry(StoredMessage("p", least, now, b"x", txn=txn)))
                )
                if v4:
                    batch.append(ledger.append(marker_entry(txn, "COMMIT", now)))
            positions = await asyncio.gather(*batch)
        if v4:
            await ledger.update_properties({CONTAINS_TXN: "true"}, ())
        else:  # every transaction decided and cleaned: the resolved watermark is at the end
            last = max(positions)
            state = BufferState((last.ledger_id, last.entry_id))
            await servers.store.put(STATE + quote(ledger_name, safe=""), msgspec.json.encode(state))
        await ledger.close()
    servers.broker = BrokerServer(servers.settings, store=servers.store)
    await servers.broker.start()
    started = time.perf_counter()
    await servers.broker.service.serve(TopicName.parse(v4_topic))
    v4_s = time.perf_counter() - started
    buffer = servers.broker.service.topics[TopicName.parse(v4_topic)].buffer
    assert isinstance(buffer, MarkerTransactionBuffer)
    started = time.perf_counter()
    await servers.broker.service.serve(segment)
    v5_s = time.perf_counter() - started
    return v4_s, buffer.recovery["replayed"], v5_s


def ms(v: float) -> str:
    return f"{v * 1000:.2f}"


async def main(args: argparse.Namespace) -> None:
    directory = Path(tempfile.mkdtemp(prefix=".bench-v4v5-", dir=REPO))
    servers = Servers(directory)
    await servers.start()
    try:
        async with Client(servers.url) as client:
            v4_topics = [f"persistent://bench/end/t{i}" for i in range(64)]
            v5_topics = [f"topic://bench/end/t{i}" for i in range(64)]
            for topic in [*v4_topics, *v5_topics]:
                await client.admin.create_topic(topic)
            rows = [
                ["participants", "v4 p50 ms", "v4 p99 ms", "v5 p50 ms", "v5 p99 ms", "v4/v5 p50"]
            ]
            p50 = {}
            for n in (1, 8, 64):
                v4 = await end_txn(client, v4_topics[:n], args.count)
                v5 = await end_txn(client, v5_topics[:n], args.count)
                p50[n] = (percentile(v4, 50), percentile(v5, 50))
                rows.append(
                    [
                        str(n),
                        ms(p50[n][0]),
                        ms(percentile(v4, 99)),
                        ms(p50[n][1]),
                        ms(percentile(v5, 99)),
                        f"{p50[n][0] / p50[n][1]:.1f}x",
                    ]
                )
            print(f"(a) END_TXN latency, {args.count} transactions per cell")
            print_rows(rows)
            print(
                f"    64 vs 1 participants, p50: v4 {p50[64][0] / p50[1][0]:.1f}x, "
                f"v5 {p50[64][1] / p50[1][1]:.1f}x"
            )
            print("\n(b) commit after the topic (v4) / segment (v5) was terminated")
            rows = [["protocol", "outcome", "time to outcome ms"]]
            for v4_flag, label in ((True, "v4"), (False, "v5")):
                outcome, seconds = await sealed_commit(client, v4_flag)
                rows.append([label, outcome, ms(seconds)])
            print_rows(rows)

            await fill_many(client, args.topics, 20)
        skip_s, skip_replayed = await load_many(servers, args.topics, skip=True)
        full_s, full_replayed = await load_many(servers, args.topics, skip=False)
        print(f"\n(c) loading {args.topics} persistent topics with no transactional message")
        print_rows(
            [
                ["PIP-373", "load s", "per topic ms", "entries replayed"],
                [
                    "skip (property false)",
                    f"{skip_s:.2f}",
                    ms(skip_s / args.topics),
                    str(skip_replayed),
                ],
                [
                    "no skip (rebuild)",
                    f"{full_s:.2f}",
                    ms(full_s / args.topics),
                    str(full_replayed),
                ],
            ]
        )
        print(f"    rebuild / skip: {full_s / skip_s:.2f}x")
        async with Client(servers.url) as client:
            v4_s, replayed, v5_s = await history(servers, client, args.history)
        print(f"\n(d) loading one topic with {args.history:,} historical transactions")
        print_rows(
            [
                ["protocol", "load s", "entries replayed"],
                ["v4 (replay)", f"{v4_s:.3f}", f"{replayed:,}"],
                ["v5 (no replay)", f"{v5_s:.3f}", "0"],
            ]
        )
        print(f"    v4 / v5: {v4_s / v5_s:.0f}x")
    finally:
        await servers.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50, help="Transactions per END_TXN cell.")
    parser.add_argument("--topics", type=int, default=1000, help="Topics for (c).")
    parser.add_argument("--history", type=int, default=100_000, help="Transactions for (d).")
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
