"""A de-duplication snapshot whose write meets another owner's fence unloads its topic,
once, as an append or a cursor save that meets it does.

Every write of a snapshot is conditional on the topic's ledger's metadata record at the
version its owner last wrote (segtxn/broker/dedup_snapshots.py): another owner's open moves
it. A snapshot that met it (``SnapshotFenced``) was logged and nothing more: the broker kept
serving a topic it no longer owned, and its producers' sends were stored there (on a file
ledger nothing else checks the record) until some later append or cursor save met the fence
in its turn. Now the proof of another owner is told to the ledger wherever it is found
(:func:`segtxn.ledger.ownership.changed_by_its_owner`), and the broker lets the topic go
and hangs up on its clients, who find it where it is served now.

Real components: a broker (aiohttp, file ledgers, the memory store and a real etcd) and the
client; "another owner" changes the ledger's metadata record in the store as an open by
another broker would.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.client import Client
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore
from segtxn.protocol.names import TopicName
from tests.broker.test_fenced_cursor_unload import record_let_go
from tests.broker.test_fenced_cursor_unload import serving as fenced_cursor_broker
from tests.waiting import wait_until

TOPIC = "persistent://acme/dedup/fenced"
NAME = TopicName.parse(TOPIC)


def serving(
    store: MetadataStore, tmp_path: Path, *, snapshot_every: int
) -> contextlib.AbstractAsyncContextManager[tuple[BrokerServer, Client]]:
    """A broker on ``store`` that snapshots de-duplication every ``snapshot_every``
    messages, and a client of it."""
    return fenced_cursor_broker(
        store, tmp_path, "b-fenced-snapshot", dedup_snapshot_every=snapshot_every
    )


async def take_over(store: MetadataStore, ledger: str) -> None:
    """Another owner's change of ``ledger``'s metadata record (an open of it by another
    broker moves it): every write conditional on it is fenced from now on."""
    key = metadata_key(ledger)
    record = await store.get(key)
    assert record is not None
    await store.put(key, record.value, expected_version=record.version)


async def test_a_snapshot_fenced_by_another_owner_unloads_the_topic_once(
    store: MetadataStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(store, tmp_path, snapshot_every=2) as (broker, client):
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC, name="p")
        await producer.send(b"a")  # (one stored: no snapshot due yet)
        topic = broker.service.topics[NAME]
        let_go = record_let_go(monkeypatch)
        await take_over(store, TOPIC)
        with caplog.at_level(logging.WARNING):
            await producer.send(b"b")  # a snapshot is due: its write meets the fence
            await wait_until(
                lambda: broker.service.topics.get(NAME) is not topic,
                what="the fenced topic unloaded",
            )
            await wait_until(lambda: not broker.service.dropping, what="the unload done")
        said = [r.getMessage() for r in caplog.records]
        assert [s for s in said if "SnapshotFenced" in s], said  # the snapshot met it first
        assert [s for s in said if TOPIC in s and "unloading it" in s], said
        assert not [s for s in said if "incident" in s], said
        # its close took a last snapshot, fenced again: the topic was still let go of once
        assert [t for t in let_go if t is topic] == [topic], let_go
        # the producer goes on where the topic is served now (here: loaded again), its
        # sends not stored twice
        await producer.send(b"c")
        await producer.close()
        reader = await client.create_reader(TOPIC, start="earliest")
        got = [(await reader.receive(timeout_s=10)).value for _ in range(3)]
        assert got == [b"a", b"b", b"c"], got
        await reader.close()
