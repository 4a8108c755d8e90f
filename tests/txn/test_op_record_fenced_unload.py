"""An op-record step refused because another broker opened the segment's ledger unloads the
segment, once, as an append or a cursor save that meets the same fence does.

A transactional send's op record is written in a step conditional on the segment's ledger's
metadata record at the version its broker last wrote (segtxn/broker/txn/oprecords.py).
Proof that another broker moved it refused the send (``TransactionConflict``, "not served by
this broker any more") and nothing more: the broker kept serving the segment it no longer
owned, and every later transactional send there was refused so, until an append or a
cursor save met the fence in its turn. Now the proof is told to the ledger where it is found
(:func:`segtxn.ledger.ownership.changed_by_its_owner`): the broker lets the segment go and
hangs up on its clients, who find it where it is served now.

A real cluster (a broker and a v5 coordinator, on the memory store and on a real etcd) and
the client; "another broker" changes the ledger's metadata record as its open would.
"""

from __future__ import annotations

import pytest

from segtxn.broker.txn import oprecords, oprefusals
from segtxn.client import Client, ErrorName, ServerError
from segtxn.protocol.errors import ServerError as WireError
from segtxn.protocol.names import TopicName
from tests.broker.test_fenced_cursor_unload import record_let_go
from tests.broker.test_fenced_snapshot_unload import take_over
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "topic://acme/ops/fenced"
SEGMENT = TopicName.parse("segment://acme/ops/fenced/0")


def record_owner_refusals(monkeypatch: pytest.MonkeyPatch) -> list[WireError | None]:
    """What each op-record step refused by the ledger's check was answered (None: the
    change was the broker's own, the step went again)."""
    refusals: list[WireError | None] = []
    original = oprefusals.owner_refusal

    async def recorded(*args: object) -> WireError | None:
        refusal = await original(*args)  # type: ignore[arg-type]
        refusals.append(refusal)
        return refusal

    monkeypatch.setattr(oprecords, "owner_refusal", recorded)
    return refusals


async def test_an_op_record_fenced_by_another_broker_unloads_the_segment_once(
    client: Client, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = cluster.broker.service
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    txn = await client.transaction().start()
    await producer.send(b"first", txn=txn)
    segment = service.topics[SEGMENT]
    refusals = record_owner_refusals(monkeypatch)
    let_go = record_let_go(monkeypatch)
    await take_over(cluster.store, str(SEGMENT))
    with pytest.raises(ServerError) as refused:  # (or its resend, after the hang-up)
        await producer.send(b"second", txn=txn)
    assert refused.value.name is ErrorName.TRANSACTION_CONFLICT, refused.value
    await wait_until(
        lambda: service.topics.get(SEGMENT) is not segment, what="the fenced segment unloaded"
    )
    await wait_until(lambda: not service.dropping, what="the unload done")
    # the op record met the fence (proof of another broker), and the segment was let go
    # of once, whatever else met the fence after it (its close)
    fenced = [r for r in refusals if r is not None]
    assert fenced, refusals
    assert fenced[0].name is ErrorName.TRANSACTION_CONFLICT, fenced
    assert "not served by this broker any more" in fenced[0].message, fenced
    assert [t for t in let_go if t is segment] == [segment], let_go
    await txn.abort()
    await producer.close()
