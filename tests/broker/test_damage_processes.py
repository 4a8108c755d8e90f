"""The tester's cases of issue 15 with real broker processes on etcd: SIGKILL, damage the
files, restart; what clients, /readyz and the broker's log say."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from segtxn.client import Client
from segtxn.ledger import FileLogStorage
from segtxn.ledger.metadata import decode, metadata_key
from segtxn.metastore import open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import TopicName
from tests import processes
from tests.processes import ServerProcess
from tests.waiting import wait_until

TTL = 2.0
"""The brokers' session TTL: a broker restarted after a SIGKILL with its id waits for its
old session to expire before it serves (the 10 s default would be most of each test)."""


@pytest.fixture
def cluster_store(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"/damage-procs-{os.getpid()}-{uuid.uuid4().hex[:8]}")


async def _open_ledger_file(store_url: str, data_dir: Path, topic: str) -> Path:
    """The file of the ledger the killed broker was appending to for ``topic``."""
    async with open_store(store_url) as store:
        record = await store.get(metadata_key(topic))
    assert record is not None
    last = decode(record.value).ledgers[-1]
    assert last.entries is None  # killed while open
    return FileLogStorage(data_dir).path(topic, last.id)


async def _get(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, await response.json()


@pytest.mark.slow
async def test_sigkill_then_damage_or_a_cut_tail(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """8 bytes damaged mid-ledger: refused, named, logged (it lost 15 of 30 acknowledged
    entries silently). The last 5 bytes cut: nothing acknowledged lost, logged (it lost
    the last acknowledged entry silently)."""
    data = tmp_path / "b1"
    broker = processes.broker(cluster_store, data, "b1", session_ttl=TTL, log=tmp_path / "b1.log")
    started.append(broker)
    broker.start()
    await broker.ready()
    damaged, cut = "persistent://acme/disk/damaged", "persistent://acme/disk/cut"
    async with Client(broker.url) as client:
        for topic in (damaged, cut):
            await client.admin.create_topic(topic)
            producer = await client.create_producer(topic)
            for i in range(30):  # each acknowledged before the next is sent
                await producer.send(f"{topic}-{i}".encode() * 10)
    broker.kill()
    damaged_file = await _open_ledger_file(cluster_store, data, damaged)
    with damaged_file.open("r+b") as f:
        f.seek(damaged_file.stat().st_size // 2)
        f.write(b"\xde\xad\xbe\xef" * 2)
    cut_file = await _open_ledger_file(cluster_store, data, cut)
    os.truncate(cut_file, cut_file.stat().st_size - 5)

    broker.start()
    await broker.ready()  # not a crash loop: it serves, and refuses what it must
    async with Client(broker.url) as client:
        with pytest.raises(ServerError) as refused:
            await client.admin.stats(damaged)
        assert refused.value.name is ErrorName.PERSISTENCE
        assert str(damaged_file) in refused.value.message
        assert "acknowledged" in refused.value.message
        consumer = await client.subscribe(cut, "check", initial_position="earliest")
        got = [(await consumer.receive(timeout_s=10)).value for _ in range(30)]
        assert got == [f"{cut}-{i}".encode() * 10 for i in range(30)]
        await client.admin.create_topic("persistent://acme/disk/fresh")  # others are served
        await (await client.create_producer("persistent://acme/disk/fresh")).send(b"ok")
    log = broker.log_text()
    assert f"refusing to serve {damaged}" in log and str(damaged_file) in log
    assert f"truncated {cut_file}" in log and "keeping entries 0..29" in log
    assert "WARNING" in log.split(f"truncated {cut_file}")[0].splitlines()[-1]


@pytest.mark.slow
async def test_a_broker_restarted_on_an_empty_volume_refuses_its_segments(
    cluster_store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """Three brokers on etcd; one comes back on an empty data directory. It used to serve
    its segments as empty (256 of 1,814 acknowledged messages gone, nothing said)."""
    brokers = [
        processes.broker(
            cluster_store, tmp_path / f"b{i}", f"b{i}", session_ttl=TTL, log=tmp_path / f"b{i}.log"
        )
        for i in range(3)
    ]
    started += brokers
    for broker in brokers:
        broker.start()
    for broker in brokers:
        await broker.ready()
    topic = "topic://acme/volume/orders"
    sent = [f"order-{i}".encode() for i in range(60)]
    async with Client(brokers[0].url) as client:
        await client.admin.create_topic(topic, segments=6)
        producer = await client.create_producer(topic)
        for i, payload in enumerate(sent):
            await producer.send(payload, key=f"k{i}")
        layout = await client.connector.lookup(TopicName.parse(topic))
    victim = brokers[1]
    theirs = {f"segment://acme/volume/orders/{s['id']}" for s in layout["segments"]
              if s["brokerUrl"] == victim.url}  # fmt: skip
    assert theirs
    victim.kill()

    empty = tmp_path / "empty"
    wrong = processes.broker(
        cluster_store, empty, "b1", session_ttl=TTL, log=tmp_path / "wrong.log"
    )
    started.append(wrong)
    wrong.start()

    async def answers() -> bool:
        try:
            return (await _get(wrong.url + "/readyz"))[0] == 503
        except aiohttp.ClientError:
            return False

    await wait_until(answers, timeout=30, what="the wrong-volume broker answering /readyz")
    status, body = await _get(wrong.url + "/readyz")
    assert status == 503 and "no ledger files" in body["reason"] and str(empty) in body["reason"]
    assert set(body["refused"]) == theirs
    for segment in theirs:
        path = TopicName.parse(segment).path
        status, error = await _get(f"{wrong.url}/admin/v2/{path}/stats")
        assert error["error"] == ErrorName.PERSISTENCE.value and str(empty) in error["message"]
    assert "the data directory is empty or not this broker's volume" in wrong.log_text()
    assert not list(empty.rglob("*.log"))  # nothing recreated empty
    wrong.kill()

    victim.start()  # the right volume again: everything is there
    await victim.ready()
    async with Client(brokers[0].url) as client:
        consumer = await client.subscribe(topic, "audit", initial_position="earliest")
        got = {(await consumer.receive(timeout_s=20)).value for _ in sent}
    assert got == set(sent)
