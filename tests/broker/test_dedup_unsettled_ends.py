"""How a send's hold on the de-duplication snapshots ends, and what a load does with a
damaged entry the snapshot no longer lets it skip.

A send not settled yet bounds every snapshot's ``position`` and ``taken_at`` by the ledger's
last entry when it was taken in (tests/broker/test_dedup_unsettled.py). A transactional
send whose op record the store refuses must fail (its producer told) and stop holding
them, or the replay of a reload grows for as long as the store refuses. And since a
snapshot's ``taken_at`` can now be lower than the last entry noted, a damaged entry after
it fails the load (it may be the unsettled send's entry, which the snapshot does not hold:
skipped, that send's resend would be stored again); the error must name the ledger, the
file and the entry, and say that de-duplication's replay needs it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from segtxn.broker.dedup import Deduplication
from segtxn.broker.dedup_snapshots import DedupSnapshot, record_key
from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.client import Client
from segtxn.ledger import FileLogStorage, LedgerCorrupted, LedgerSettings, ManagedLedger, Position
from segtxn.ledger.records import HEADER_SIZE, decode_header, scan
from segtxn.metastore import open_store
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.frames import Error, Send
from tests.broker.test_dedup_unsettled import (
    EVERY,
    SCALABLE,
    SEGMENT,
    TOPIC,
    raw_producer,
    receipts,
    store_plain,
)
from tests.cluster import Cluster
from tests.wsframes import next_frame


async def test_a_send_whose_op_record_the_store_refuses_fails_and_holds_nothing_back(
    cluster: Cluster,
) -> None:
    """ "t"'s transactional send is durable, and the store refuses its op record: "t" is
    told it was not stored, and the snapshot taken after "p"'s next interval vouches for
    every entry up to "p"'s last (t's, an orphan, included)."""
    async with Client(cluster.url) as client:
        await client.admin.create_topic(SCALABLE, segments=1)
        txn = await client.transaction().start()
        async with raw_producer(cluster, "p") as (p, _), raw_producer(cluster, "t") as (t, _):
            await receipts(p, Send(seq=0, payload=b"p"))
            cluster.faults.fail("txn", key_prefix="/txn-op/", times=None)
            try:
                await t.send_bytes(frames.encode(Send(seq=0, payload=b"t", txn=txn.wire_id)))
                refused = await next_frame(t)
            finally:
                cluster.faults.clear()
            assert isinstance(refused, Error) and refused.seq == 0, refused
            assert refused.error == ErrorName.SERVICE_NOT_READY.value, refused
            assert "could not record the op" in refused.message, refused
            topic = cluster.broker.service.topics[SEGMENT]
            t_entry = topic.ledger.last_confirmed  # durable before its record was refused
            assert t_entry is not None and not topic.publishing.dedup.state("t").floors
            stored = await receipts(p, *(Send(seq=i, payload=b"p") for i in range(1, 1001)))
            await topic.publishing.settle()  # the interval's snapshot written
        record = await cluster.store.get(record_key(str(SEGMENT)))
        assert record is not None
        snapshot = msgspec.json.decode(record.value, type=DedupSnapshot)
        assert snapshot.taken_at is not None and Position(*snapshot.taken_at) > t_entry, (
            f"held back at {snapshot.taken_at} by t's failed send (its entry: {t_entry}; "
            f"p's last: {stored[-1].message_id})"
        )
        await txn.abort()


def flip_entry(path: Path, ledger_id: int, entry_id: int) -> None:
    """Damage entry ``entry_id`` of ledger ``ledger_id``'s file, as a disk would."""
    data = path.read_bytes()
    offset = scan(data, start=HEADER_SIZE, nonce=decode_header(data, ledger_id)).offsets[entry_id]
    with path.open("r+b") as f:
        f.seek(offset + 40)
        f.write(b"\xff\xff")


async def test_a_damaged_entry_the_snapshot_does_not_hold_fails_the_load_naming_it(
    tmp_path: Path,
) -> None:
    """Ledger 2: "p"'s send 1, "t"'s send taken in (its transaction's record slow), "t"'s
    entry, "p"'s sends 2 and 3 (a snapshot: its ``taken_at`` is p's send 1, before t's
    entry). Ledger 2's entry 2 (p's send 2) is damaged: past ``taken_at``, it may be one the
    snapshot does not hold, so the load fails, saying where and why."""
    async with open_store("memory://") as store:
        storage = FileLogStorage(tmp_path)
        ledger = await ManagedLedger.open(TOPIC, store, storage, LedgerSettings())
        dedup = Deduplication(TOPIC, store, EVERY)
        await dedup.recover(ledger)
        await store_plain(dedup, ledger, range(1))
        await ledger.roll_over()
        await store_plain(dedup, ledger, range(1, 2))
        t = dedup.state("t")
        original = asyncio.get_running_loop().create_future()
        t.take_in(0, original, ledger.last_confirmed)
        t_entry = await ledger.append(encode_entry(StoredMessage("t", 0, 0, b"t", txn=(1, 1))))
        await store_plain(dedup, ledger, range(2, EVERY))  # the snapshot, t still unsettled
        t.in_flight.pop(0)
        original.set_result(t_entry)
        dedup.note_stored("t", 0, t_entry)
        await ledger.roll_over()  # ledger 2 closed: its damage does not stop the open
        await store_plain(dedup, ledger, range(EVERY, EVERY + 1))
        await ledger.close()  # a crash: no closing snapshot
        damaged = storage.path(TOPIC, 2)
        flip_entry(damaged, 2, 2)
        ledger = await ManagedLedger.open(TOPIC, store, storage, LedgerSettings())
        try:
            with pytest.raises(LedgerCorrupted) as refused:
                await Deduplication(TOPIC, store, EVERY).recover(ledger)
        finally:
            await ledger.close()
    message = str(refused.value)
    assert refused.value.path == str(damaged), refused.value.path
    assert str(damaged) in message and "entry 2 " in message, message
    assert message.startswith(TOPIC) and "de-duplication" in message, message
