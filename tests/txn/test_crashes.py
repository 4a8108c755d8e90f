"""v5 transactions with real processes killed by SIGKILL (etcd as the store)."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from pathlib import Path

import pytest

from segtxn.client import Client, ServerError
from segtxn.metastore import open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.topics import transactions as T
from tests import processes
from tests.processes import ServerProcess
from tests.waiting import wait_until

TOPIC = "topic://acme/crash/orders"


@pytest.fixture
def store_url(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"/txncrash-{os.getpid()}-{uuid.uuid4().hex[:8]}")


async def _up(servers: list[ServerProcess], *new: ServerProcess) -> None:
    for server in new:
        servers.append(server)
        server.start()
    await asyncio.gather(*(s.ready() for s in new))


@pytest.mark.slow
async def test_coordinator_killed_mid_end_txn_is_taken_over(
    store_url: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    seed = random.randrange(2**32)
    print(f"coordinator crash seed {seed}")
    rng = random.Random(seed)
    broker = processes.broker(store_url, tmp_path / "b1", "b1")
    first = processes.coordinator(store_url, "c1", session_ttl=2)
    await _up(started, broker, first)
    standby = processes.coordinator(store_url, "c2", session_ttl=2)
    started.append(standby)
    standby.start()
    async with Client(broker.url) as client:
        await client.admin.create_topic(TOPIC, segments=4)
        consumer = await client.subscribe(TOPIC, "check", initial_position="earliest")
        producer = await client.create_producer(TOPIC)
        txn = await client.transaction().start()
        for i in range(20):
            await producer.send(f"m{i}".encode(), key=f"k{i}", txn=txn)
        committing = asyncio.create_task(txn.commit())
        await asyncio.sleep(rng.uniform(0, 0.01))  # sleep-ok: a seeded kill moment
        first.kill()
        try:
            await asyncio.wait_for(committing, 60)
        except Exception:
            await txn.commit()  # END_TXN is idempotent: the standby answers
        assert await txn.status() == "COMMITTED"
        got = set()
        for _ in range(20):
            message = await consumer.receive(timeout_s=30)
            got.add(message.value)
            await consumer.acknowledge(message)
        assert got == {f"m{i}".encode() for i in range(20)}
        await standby.ready()  # it took the ids over: new transactions work, no replay
        async with client.transaction() as later:
            await producer.send(b"after", key="k0", txn=later)
        assert (await consumer.receive(timeout_s=30)).value == b"after"


@pytest.mark.slow
async def test_participant_killed_mid_materialization_finishes_on_restart(
    store_url: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    broker = processes.broker(store_url, tmp_path / "b1", "b1", session_ttl=2)
    coordinator = processes.coordinator(store_url, "c1")
    await _up(started, broker, coordinator)
    source, sink = "topic://acme/crash/in", "topic://acme/crash/out"
    async with Client(broker.url) as client:
        await client.admin.create_topic(source, segments=2)
        await client.admin.create_topic(sink, segments=2)
        inputs = await client.create_producer(source)
        for i in range(10):
            await inputs.send(f"{i}".encode(), key=f"k{i}")
        consumer = await client.subscribe(source, "etl", initial_position="earliest")
        outputs = await client.create_producer(sink)
        async with client.transaction() as txn:
            for _ in range(10):
                message = await consumer.receive(timeout_s=10)
                await outputs.send(message.value * 2, key=message.key, txn=txn)
                await consumer.acknowledge(message, txn=txn)
        broker.kill()  # right after the commit: materialization may be half done
    broker.start()
    await broker.ready()
    async with Client(broker.url) as client:
        reader = await client.subscribe(sink, "check", initial_position="earliest")
        got = sorted([(await reader.receive(timeout_s=30)).value for _ in range(10)])
        assert got == sorted(f"{i}".encode() * 2 for i in range(10))
        consumer = await client.subscribe(source, "etl", initial_position="earliest")
        with pytest.raises(TimeoutError):
            await consumer.receive(timeout_s=0.5)  # bounded absence check: acks applied
        store = open_store(store_url)
        try:

            async def drained() -> bool:
                return not (await store.list_prefix(T.OPS)).records

            await wait_until(drained, timeout=30, what="participants cleaned their op records")
        finally:
            await store.close()


@pytest.mark.slow
async def test_v4_coordinator_killed_mid_fan_out_finishes_from_its_log(
    store_url: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """The participant's broker is frozen (SIGSTOP) so the fan-out cannot finish; the
    coordinator is SIGKILLed with COMMITTING in its log; a new coordinator process on the
    same log directory replays it and commits once the broker runs again."""
    import signal

    broker = processes.broker(store_url, tmp_path / "b1", "b1")
    v4 = ("--data-dir", str(tmp_path / "txn-logs"), "--v4-ids", "1")
    first = processes.coordinator(store_url, "c1", session_ttl=2, extra=v4)
    await _up(started, broker, first)
    topic = "persistent://acme/crash/legacy"
    async with Client(broker.url) as client:
        await client.admin.create_topic(topic)
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        producer = await client.create_producer(topic)
        txn = client.transaction()
        await producer.send(b"x", txn=txn)
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGSTOP)
        try:
            path = f"{first.url}/txn/v2/{txn.id}/end"
            ending = asyncio.ensure_future(
                client.connector.request("POST", path, params={"action": "COMMIT"})
            )

            async def committing() -> bool:
                status = await client.connector.request("GET", f"{first.url}/txn/v2/{txn.id}")
                return bool(status["state"] == "COMMITTING")

            await wait_until(committing, timeout=10, what="COMMITTING logged")
            first.kill()
            with pytest.raises(Exception):  # noqa: B017 - the connection died with it
                await ending
        finally:
            broker.proc.send_signal(signal.SIGCONT)
        second = processes.coordinator(store_url, "c2", session_ttl=2, extra=v4)
        await _up(started, second)

        async def committed() -> bool:
            try:
                status = await client.connector.request("GET", f"{second.url}/txn/v2/{txn.id}")
            except ServerError:  # not taken over yet (ServiceNotReady)
                return False
            return bool(status["state"] == "COMMITTED")

        await wait_until(committed, timeout=30, what="the successor finishing the commit")
        message = await consumer.receive(timeout_s=10)
        assert message.value == b"x"
