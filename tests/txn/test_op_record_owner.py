"""An op-record step refused by its segment's ledger's ownership check is "not served by this
broker any more" (TransactionConflict) only on proof that another broker opened the ledger.

The step is conditional on the ledger's metadata record at the version this broker last
wrote. When the ledger's own change of that record is in doubt (it landed, its answer and
read-back lost), only settling that change tells whose change the step met. Before, only a
store that did not answer was told as the store's trouble: a read refused
(``StoreAccessDenied``), a store closed under it (``StoreClosed``), or the record found
holding a rollover of the ledger's own (it must be reopened) were taken for a take-over, and
the send was told its segment had moved while nothing had taken it. And a read that failed
once failed the send, where the de-duplication snapshot's check reads again: the check is
one shared behaviour (:mod:`segtxn.ledger.ownership`).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from segtxn.broker.txn.oprefusals import owner_refusal
from segtxn.client import Client, ErrorName, MessageId, ServerError, Transaction
from segtxn.ledger import FileLogStorage, LedgerError, LedgerSettings, ManagedLedger
from segtxn.ledger.fencing import OutcomeUnknown
from segtxn.ledger.metadata import metadata_key
from segtxn.ledger.ownership import OWNER_READS
from segtxn.metastore import (
    BadVersion,
    MetadataStoreError,
    StoreAccessDenied,
    StoreClosed,
    open_store,
)
from segtxn.metastore.faults import FaultInjector
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnId
from tests.cluster import Cluster

TOPIC = "topic://acme/ops/owner"
SEGMENT = TopicName.parse("segment://acme/ops/owner/0")
KEY = metadata_key(str(SEGMENT))


async def step_meeting_an_own_change_in_doubt(
    client: Client,
    cluster: Cluster,
    *,
    reads_failing: int | None,
    error: MetadataStoreError | None = None,
    rollover: bool = False,
) -> tuple[Transaction, asyncio.Future[MessageId]]:
    """A transactional send whose op-record step is built on the ledger's version and held
    while the ledger's own change of its record lands with its answer and read-back lost
    (``rollover``: that change is a rollover); then ``reads_failing`` reads of the record
    fail with ``error`` (None: all of them) and the step goes on. Returns the send."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    txn = await client.transaction().start()
    await producer.send(b"first", txn=txn)
    held = cluster.faults.hold("txn", key_prefix="/txn-op/", times=1, before=True)
    second = await producer.send_async(b"second", txn=txn)
    await held.wait_for(1)  # the step is built (with the ledger's version), not yet sent
    ledger = cluster.broker.service.topics[SEGMENT].ledger
    cluster.faults.fail("txn", key_prefix=KEY, after_apply=True)
    cluster.faults.fail("range", key_prefix=KEY, times=1)  # the read-back
    with pytest.raises(OutcomeUnknown):
        if rollover:
            await ledger.roll_over()
        else:
            await ledger.update_properties({"changed": "yes"})
    if reads_failing != 0:
        cluster.faults.fail("range", key_prefix=KEY, times=reads_failing, error=error)
    held.release(0)
    return txn, second


def not_a_take_over(refused: ServerError) -> None:
    assert refused.name is ErrorName.SERVICE_NOT_READY, refused
    assert "could not tell whether" in refused.message, refused.message
    assert "not served by this broker any more" not in refused.message, refused.message


@pytest.mark.parametrize(
    "refusal",
    [StoreAccessDenied("injected: permission denied"), StoreClosed("injected: store closed")],
    ids=["access-denied", "closed"],
)
async def test_a_refused_read_of_the_segments_owner_is_not_a_take_over(
    client: Client, cluster: Cluster, refusal: MetadataStoreError
) -> None:
    txn, second = await step_meeting_an_own_change_in_doubt(
        client, cluster, reads_failing=None, error=refusal
    )
    with pytest.raises(ServerError) as refused:
        await second
    cluster.faults.clear()
    not_a_take_over(refused.value)
    assert str(refusal) in refused.value.message, refused.value.message
    await txn.abort()


async def test_a_rollover_of_its_own_found_by_the_check_is_not_a_take_over(
    tmp_path: Path,
) -> None:
    """The record holds the ledger's own rollover, landed unseen: the ledger must be
    reopened (its broker unloads the segment), but no other broker has it, so the ops are
    refused as ServiceNotReady, not TransactionConflict. (On the writer's refusal itself:
    through a broker, the unload answers the send first.)"""
    async with open_store("memory://", wrap=FaultInjector) as store:
        faults = store.engine
        assert isinstance(faults, FaultInjector)
        ledger = await ManagedLedger.open(
            str(SEGMENT), store, FileLogStorage(tmp_path), LedgerSettings()
        )
        try:
            await ledger.append(b"e")
            checked = ledger.metadata_version
            faults.fail("txn", key_prefix=KEY, after_apply=True)
            faults.fail("range", key_prefix=KEY, times=1)  # the read-back
            with pytest.raises(OutcomeUnknown):
                await ledger.roll_over()
            refused = await owner_refusal(
                TxnId(1, 1), ledger, checked, BadVersion(KEY, checked, checked + 1)
            )
            assert refused is not None
            not_a_take_over(refused)
            assert "rollover of its own" in refused.message, refused.message
        finally:
            with contextlib.suppress(LedgerError, MetadataStoreError):
                await ledger.close()


async def test_a_read_of_the_owner_failing_briefly_does_not_fail_the_send(
    client: Client, cluster: Cluster
) -> None:
    """The read that settles the ledger's own change fails ``OWNER_READS - 1`` times, then
    answers: the step is tried again on the new version, and the send is recorded (it
    failed ServiceNotReady on the first failed read)."""
    reads = cluster.faults.count("range", key_prefix=KEY)
    txn, second = await step_meeting_an_own_change_in_doubt(
        client, cluster, reads_failing=OWNER_READS - 1
    )
    await second
    assert reads.calls >= 1 + OWNER_READS, reads  # the read-back, then the check's reads
    await txn.commit()
