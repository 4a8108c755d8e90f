"""Issue 17: a copy that fell behind while its broker stayed registered, with broker
processes on a real etcd, ledgers replicated 3/2 and the repair interval set by its flag.

A broker is paused (SIGSTOP) for less than its session while the owner writes: the ack
quorum goes on without it, its copy of the open ledger stops short, and the writer closes
that ledger and moves on. Once resumed, every broker is registered with the instance every
placement names, so registration alone sees nothing wrong. Before, that copy stayed behind
for good; now the owner's check (every ``--repair-interval``) audits each closed ledger and
tops the copy up.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import aiohttp
import pytest

from segtxn.client import Client
from segtxn.ledger.managed import metadata_key
from segtxn.ledger.metadata import LedgerInfo, decode
from segtxn.ledger.replicas import HttpReplica, Member
from segtxn.metastore import open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.names import TopicName
from tests.metrics_scrape import scrape
from tests.processes import ServerProcess
from tests.waiting import wait_until

TTL = 30.0
"""Longer than the pause: the paused broker stays registered throughout."""
TOPIC = "persistent://acme/ha/paused"


@pytest.fixture
def cluster_store(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"/lagging-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def repairing_broker(store: str, tmp_path: Path, broker_id: str) -> ServerProcess:
    """A broker replicating 3/2 that checks its ledgers every second (logging at INFO)."""
    return ServerProcess(
        ["-v", "broker", "--store", store, "--data-dir", str(tmp_path / broker_id),
         "--broker-id", broker_id, "--session-ttl", str(TTL), "--replication", "3/2",
         "--repair-interval", "1"],
        f"broker {broker_id}",
        log=tmp_path / f"{broker_id}.log",
    )  # fmt: skip


@pytest.mark.slow
async def test_a_copy_a_paused_broker_missed_is_topped_up_by_the_owners_periodic_check(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    ids = ["p0", "p1", "p2"]
    brokers = {i: repairing_broker(cluster_store, tmp_path, i) for i in ids}
    started += brokers.values()
    for broker in brokers.values():
        broker.start()
    for broker in brokers.values():
        await broker.ready()
    sent: list[bytes] = []
    async with (
        open_store(cluster_store) as store,
        aiohttp.ClientSession() as session,
        Client(brokers["p0"].url) as client,
    ):

        async def ledgers() -> list[LedgerInfo]:
            record = await store.get(metadata_key(TOPIC))
            assert record is not None
            return list(decode(record.value).ledgers)

        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC)
        for i in range(10):
            sent.append(f"before-{i}".encode())
            await producer.send(sent[-1])
        owner_url = await client.connector.broker_for(TopicName.parse(TOPIC))
        owner = next(i for i in ids if brokers[i].url == owner_url)
        victim = next(i for i in ids if i != owner)
        open_id = (await ledgers())[-1].id
        brokers[victim].pause()
        try:

            async def left_behind() -> bool:
                """One more send; True once the ledger open at the pause has closed."""
                sent.append(f"during-{len(sent)}".encode())
                await producer.send(sent[-1])
                return any(i.id == open_id and i.entries is not None for i in await ledgers())

            await wait_until(left_behind, timeout=30, what="the ledger closed without the victim")
        finally:
            brokers[victim].resume()

        async def locate(broker: str) -> str | None:
            return brokers[broker].url

        async def victims_copies_whole() -> bool:
            for info in await ledgers():
                for member in map(Member.parse, info.replicas):
                    if info.entries is None or member.broker != victim:
                        continue
                    replica = HttpReplica(member, locate, session, timeout_s=5.0)
                    if (await replica.stat(TOPIC, info.id))[0] < info.entries:
                        return False
            return True

        resumed = time.monotonic()
        await wait_until(victims_copies_whole, timeout=30, what="the victim's copies topped up")
        print(f"the lagging copy was whole {time.monotonic() - resumed:.1f} s after the resume")

        async def none_under_replicated() -> bool:  # (counted until the next check)
            found = await scrape(brokers[owner].url)
            return found.value("segtxn_broker_under_replicated_ledgers") == 0

        await wait_until(none_under_replicated, timeout=15, what="the gauge back to 0")
    log = brokers[owner].log_text()
    assert f"ledger {open_id} of {TOPIC}: topped up its copy on {victim}@" in log
    async with Client(brokers[victim].url) as client:
        consumer = await client.subscribe(TOPIC, "check", initial_position="earliest")
        got = [(await consumer.receive(timeout_s=10)).value for _ in sent]
    assert got == sent
