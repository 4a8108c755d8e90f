"""A de-duplication snapshot whose ownership check cannot be settled because the store
cannot be read is told as that, not as a fence, and is written once the store answers.

Every snapshot write checks that the topic's ledger's metadata record is at the version its
owner last wrote (tests/broker/test_dedup_two_owners.py). When the ledger's own last change
of that record had its answer and its read-back lost (it landed, unseen), the check fails on
the owner's own change, and only a read of the record tells it from another owner's. With
that read failing too, the snapshot was refused as ``SnapshotFenced``, "opened by another
owner": a WARNING telling an operator of a take-over that never happened, and at a topic's
close its last snapshot skipped even when the store answered again a moment later (a reload
replayed from an older one).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.dedup import Deduplication
from segtxn.broker.dedup_snapshots import SnapshotFenced, SnapshotOwnerUnknown, record_key
from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client
from segtxn.ledger import FileLogStorage, LedgerError, LedgerSettings, ManagedLedger
from segtxn.ledger.fencing import OutcomeUnknown
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import (
    MetadataStore,
    MetadataStoreError,
    StoreAccessDenied,
    StoreClosed,
    open_store,
)
from segtxn.metastore.faults import FaultInjector
from segtxn.protocol.names import TopicName
from segtxn.web import Listener

TOPIC = "persistent://acme/dedup/owner-unknown"


async def owned_change_in_doubt(
    ledger: ManagedLedger, faults: FaultInjector, reads: int | None
) -> None:
    """The ledger's own change of its metadata record lands, but its answer and its
    read-back are lost: the ledger does not know the record's version. ``reads``: how many
    reads of the record fail from then on, the read-back's included (None: all)."""
    key = metadata_key(ledger.name)
    faults.fail("txn", key_prefix=key, after_apply=True)
    faults.fail("range", key_prefix=key, times=reads)
    with pytest.raises(OutcomeUnknown):
        await ledger.update_properties({"changed": "yes"})


async def open_owner(store: MetadataStore, tmp_path: Path) -> tuple[ManagedLedger, Deduplication]:
    ledger = await ManagedLedger.open(TOPIC, store, FileLogStorage(tmp_path), LedgerSettings())
    dedup = Deduplication(TOPIC, store, snapshot_every=10**6)
    await dedup.recover(ledger)
    return ledger, dedup


async def store_one(ledger: ManagedLedger, dedup: Deduplication, seq: int) -> None:
    position = await ledger.append(encode_entry(StoredMessage("p", seq, 0, b"x")))
    dedup.note_stored("p", seq, position)


async def test_an_unreadable_ownership_check_is_not_a_fence_and_the_snapshot_follows(
    store: MetadataStore, faults: FaultInjector, tmp_path: Path
) -> None:
    ledger, dedup = await open_owner(store, tmp_path)
    try:
        await store_one(ledger, dedup, 0)
        await owned_change_in_doubt(ledger, faults, reads=None)
        with pytest.raises(SnapshotOwnerUnknown) as refused:
            await dedup.snapshot()
        assert not isinstance(refused.value, SnapshotFenced)
        message = str(refused.value)
        assert "could not tell whether" in message and "another owner" in message, message
        assert "injected fault" in message, message  # what the store said
        faults.clear()  # the store answers again: the next snapshot is written
        await store_one(ledger, dedup, 1)
        await dedup.snapshot()
    finally:
        faults.clear()
        await ledger.close()
    ledger, reloaded = await open_owner(store, tmp_path)
    await ledger.close()
    assert reloaded.producers["p"].last == 1


async def test_an_ownership_check_read_failing_once_does_not_lose_the_snapshot(
    store: MetadataStore, faults: FaultInjector, tmp_path: Path
) -> None:
    """A store that fails one read of the record and answers the next: the check is read
    again, finds the owner's own change, and the snapshot is written (a topic's closing
    snapshot was skipped for one failed read)."""
    ledger, dedup = await open_owner(store, tmp_path)
    try:
        await store_one(ledger, dedup, 0)
        await owned_change_in_doubt(ledger, faults, reads=2)  # the read-back and one more
        await dedup.snapshot()
    finally:
        faults.clear()
        await ledger.close()
    assert await store.get(record_key(TOPIC)) is not None


@pytest.fixture
async def memory_store() -> AsyncIterator[MetadataStore]:
    opened = open_store("memory://", wrap=FaultInjector)
    yield opened
    await opened.close()


async def test_a_topic_closing_tells_an_unreadable_check_from_a_take_over(
    memory_store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Through a broker: the topic's last snapshot, as it is unloaded, is one WARNING saying
    the store could not tell (no traceback), never that another owner opened it."""
    faults = memory_store.engine
    assert isinstance(faults, FaultInjector)
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    broker = BrokerServer(
        BrokerSettings(
            broker_id="b-owner-unknown",
            advertise_url=f"http://127.0.0.1:{listener.port}",
            ledger_url=f"file://{tmp_path / 'ledgers'}",
        ),
        store=memory_store,
        listener=listener,
    )
    await broker.start()
    try:
        async with Client(broker.settings.advertise_url) as client:
            await client.admin.create_topic(TOPIC)
            producer = await client.create_producer(TOPIC)
            await producer.send(b"m")
            await producer.close()
        topic = broker.service.topics[TopicName.parse(TOPIC)]
        await owned_change_in_doubt(topic.ledger, faults, reads=None)
        with caplog.at_level(logging.WARNING):
            await broker.service.unload(TopicName.parse(TOPIC))
    finally:
        faults.clear()
        await broker.stop()
    logged = [r for r in caplog.records if "final de-duplication snapshot" in r.getMessage()]
    assert logged, [r.getMessage() for r in caplog.records]
    [record] = logged
    assert record.levelno == logging.WARNING and record.exc_info is None, record.exc_info
    said = record.getMessage()
    assert "SnapshotOwnerUnknown" in said and "could not tell whether" in said, said
    assert "this one writes nothing more" not in said, said  # (a fence's words)


@pytest.mark.parametrize(
    "refusal",
    [StoreAccessDenied("injected: permission denied"), StoreClosed("injected: store closed")],
    ids=["access-denied", "closed"],
)
async def test_a_refused_read_of_the_ownership_check_is_not_a_fence(
    store: MetadataStore, faults: FaultInjector, tmp_path: Path, refusal: MetadataStoreError
) -> None:
    """Not only a store that does not answer: one that refuses the read (who the broker is,
    or a store closed under it) proves no take-over either (it was ``SnapshotFenced``)."""
    ledger, dedup = await open_owner(store, tmp_path)
    try:
        await store_one(ledger, dedup, 0)
        await owned_change_in_doubt(ledger, faults, reads=1)  # the read-back
        faults.fail("range", key_prefix=metadata_key(ledger.name), times=None, error=refusal)
        with pytest.raises(SnapshotOwnerUnknown) as refused:
            await dedup.snapshot()
        assert str(refusal) in str(refused.value), str(refused.value)
        faults.clear()
        await dedup.snapshot()  # the store answers again: written
    finally:
        faults.clear()
        await ledger.close()
    assert await store.get(record_key(TOPIC)) is not None


async def test_a_rollover_of_its_own_found_by_the_ownership_check_is_not_a_fence(
    store: MetadataStore, faults: FaultInjector, tmp_path: Path
) -> None:
    """The record holds the ledger's own rollover, landed unseen (the ledger must be
    reopened): no other owner has the topic, so the snapshot is not refused as fenced."""
    ledger, dedup = await open_owner(store, tmp_path)
    try:
        await store_one(ledger, dedup, 0)
        key = metadata_key(ledger.name)
        faults.fail("txn", key_prefix=key, after_apply=True)
        faults.fail("range", key_prefix=key, times=1)
        with pytest.raises(OutcomeUnknown):
            await ledger.roll_over()
        with pytest.raises(SnapshotOwnerUnknown) as refused:
            await dedup.snapshot()
        assert "rollover of its own" in str(refused.value), str(refused.value)
    finally:
        faults.clear()
        with contextlib.suppress(LedgerError, MetadataStoreError):
            await ledger.close()
