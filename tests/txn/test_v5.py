"""v5 transactions end to end: atomicity, READ_COMMITTED, pending acks, timeouts, GC, seals."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest

from segtxn.client import (
    Client,
    ClientError,
    ErrorName,
    Message,
    ServerError,
    TopicEnded,
    TransactionFailed,
)
from segtxn.client.consumer import Consumer
from segtxn.protocol.names import TopicName
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.waiting import wait_until

ORDERS = "topic://acme/shop/orders"
AUDIT = "topic://acme/shop/audit"


async def nothing_arrives(consumer: Consumer) -> None:
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout_s=0.3)  # bounded absence check


async def take(consumer: Consumer, n: int) -> list[Message]:
    out = []
    for _ in range(n):
        message = await consumer.receive(timeout_s=10)
        out.append(message)
        await consumer.acknowledge(message)
    return out


async def test_commit_is_atomic_across_segments_and_topics(client: Client) -> None:
    await client.admin.create_topic(ORDERS, segments=4)
    await client.admin.create_topic(AUDIT, segments=2)
    orders = await client.subscribe(ORDERS, "read", initial_position="earliest")
    audit = await client.subscribe(AUDIT, "read", initial_position="earliest")
    order_producer = await client.create_producer(ORDERS)
    audit_producer = await client.create_producer(AUDIT)
    async with client.transaction() as txn:
        ids = [await order_producer.send(f"o{i}".encode(), key=f"k{i}", txn=txn) for i in range(12)]
        await audit_producer.send(b"audit", key="a", txn=txn)
        assert len({i.topic for i in ids}) > 1  # several segments take part
        await nothing_arrives(orders)  # READ_COMMITTED: nothing before the commit
        await nothing_arrives(audit)
    got = await take(orders, 12)
    assert sorted(m.value for m in got) == sorted(f"o{i}".encode() for i in range(12))
    assert [m.value for m in await take(audit, 1)] == [b"audit"]


async def test_abort_hides_everything_and_later_messages_flow(client: Client) -> None:
    await client.admin.create_topic(ORDERS, segments=2)
    consumer = await client.subscribe(ORDERS, "read", initial_position="earliest")
    producer = await client.create_producer(ORDERS)
    with pytest.raises(RuntimeError):
        async with client.transaction() as txn:
            for i in range(6):
                await producer.send(f"aborted-{i}".encode(), key=f"k{i}", txn=txn)
            raise RuntimeError("the application changed its mind")
    assert txn.state == "ABORTED"
    for i in range(6):
        await producer.send(f"plain-{i}".encode(), key=f"k{i}")
    got = await take(consumer, 6)
    assert sorted(m.value for m in got) == sorted(f"plain-{i}".encode() for i in range(6))
    await nothing_arrives(consumer)
    stats = await client.admin.stats(ORDERS)
    assert all(s["stats"]["subscriptions"]["read"]["backlog"] == 0 for s in stats["segments"])


async def test_an_ended_transaction_says_so_when_ended_the_other_way(client: Client) -> None:
    """abort() of an aborted transaction does nothing; abort() of a committed one, and
    commit() of an aborted one, raise naming the state (before, abort() after commit()
    returned as if it had aborted)."""
    await client.admin.create_topic(ORDERS, segments=2)
    producer = await client.create_producer(ORDERS)
    committed = await client.transaction().start()
    await producer.send(b"kept", key="k", txn=committed)
    await committed.commit()
    with pytest.raises(ClientError, match="is COMMITTED: it cannot be aborted"):
        await committed.abort()
    assert committed.state == "COMMITTED"
    aborted = await client.transaction().start()
    await producer.send(b"dropped", key="k", txn=aborted)
    await aborted.abort()
    await aborted.abort()  # again: nothing to do
    with pytest.raises(ClientError, match="is ABORTED"):
        await aborted.commit()


async def test_consume_transform_produce_is_exactly_once(client: Client) -> None:
    source, sink = "topic://acme/etl/in", "topic://acme/etl/out"
    await client.admin.create_topic(source, segments=2)
    await client.admin.create_topic(sink, segments=2)
    inputs = await client.create_producer(source)
    for i in range(30):
        await inputs.send(f"{i}".encode(), key=f"k{i}")
    consumer = await client.subscribe(source, "etl", initial_position="earliest")
    outputs = await client.create_producer(sink)
    batches = 0
    processed: set[bytes] = set()
    while len(processed) < 30:
        batch = [await consumer.receive(timeout_s=10) for _ in range(5)]
        txn = client.transaction()
        async with txn:
            for message in batch:
                await outputs.send(message.value * 2, key=message.key, txn=txn)
                await consumer.acknowledge(message, txn=txn)
            batches += 1
            if batches % 3 == 0:
                await txn.abort()  # this batch will come again
        if txn.state == "COMMITTED":
            processed |= {m.value for m in batch}
    reader = await client.subscribe(sink, "check", initial_position="earliest")
    got = [m.value for m in await take(reader, 30)]
    assert sorted(got) == sorted(f"{i}".encode() * 2 for i in range(30))  # once each
    await nothing_arrives(reader)


async def test_concurrent_acks_of_one_message_in_two_transactions_conflict(
    client: Client,
) -> None:
    """Two transactions acking the same message at the same moment (two Failover members in
    a hand-over): exactly one holds it, so at most one can commit it."""
    await client.admin.create_topic(ORDERS, segments=1)
    producer = await client.create_producer(ORDERS)
    for i in range(20):
        await producer.send(f"m{i}".encode())
    consumer = await client.subscribe(ORDERS, "s", initial_position="earliest")
    for _ in range(20):
        message = await consumer.receive(timeout_s=10)
        first = await client.transaction().start()
        second = await client.transaction().start()
        results = await asyncio.gather(
            consumer.acknowledge(message, txn=first),
            consumer.acknowledge(message, txn=second),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1, results
        assert isinstance(errors[0], ServerError)
        assert errors[0].name is ErrorName.TRANSACTION_CONFLICT
        await first.abort()
        await second.abort()


async def test_acks_in_a_transaction_conflict_and_are_released_on_abort(client: Client) -> None:
    await client.admin.create_topic(ORDERS, segments=1)
    producer = await client.create_producer(ORDERS)
    await producer.send(b"only")
    consumer = await client.subscribe(
        ORDERS, "shared", subscription_type="Shared", initial_position="earliest"
    )
    message = await consumer.receive(timeout_s=10)
    first = await client.transaction().start()
    second = await client.transaction().start()
    await consumer.acknowledge(message, txn=first)
    with pytest.raises(ServerError) as conflict:
        await consumer.acknowledge(message, txn=second)
    assert conflict.value.name is ErrorName.TRANSACTION_CONFLICT
    await consumer.acknowledge(message)  # a plain ack of it is ignored
    await second.abort()
    await first.abort()  # released: delivered again
    again = await consumer.receive(timeout_s=10)
    assert again.message_id == message.message_id and again.redelivery_count >= 1
    async with client.transaction() as txn:
        await consumer.acknowledge(again, txn=txn)
    await nothing_arrives(consumer)
    stats = await client.admin.stats(ORDERS)
    assert stats["segments"][0]["stats"]["subscriptions"]["shared"]["backlog"] == 0


async def test_timeout_aborts_and_releases(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="segtxn")
    await client.admin.create_topic(ORDERS, segments=1)
    producer = await client.create_producer(ORDERS)
    await producer.send(b"input")
    consumer = await client.subscribe(ORDERS, "s", initial_position="earliest")
    message = await consumer.receive(timeout_s=10)
    txn = await client.transaction(timeout_s=0.5).start()
    await producer.send(b"never", txn=txn)
    await consumer.acknowledge(message, txn=txn)
    await wait_until(lambda: _aborted(txn), timeout=15, what="the timeout sweep aborted it")
    with pytest.raises(ServerError) as late:
        await txn.commit()
    assert late.value.name is ErrorName.INVALID_TXN_STATUS
    again = await consumer.receive(timeout_s=10)  # the pending ack was released
    assert again.value == b"input"
    await consumer.acknowledge(again)
    await nothing_arrives(consumer)  # "never" never shows

    def logged(level: int, text: str) -> bool:
        return any(r.levelno == level and text in r.getMessage() for r in caplog.records)

    # The sweep's abort is an INFO line; each participant's materialization a DEBUG one.
    segment = f"{ORDERS.replace('topic://', 'segment://')}/0"
    assert logged(logging.INFO, f"txn {txn.id}: timed out, aborted by the sweep (age ")
    await wait_until(
        lambda: (
            logged(logging.DEBUG, f"txn {txn.id}: ABORTED materialized on {segment} (1 ")
            and logged(
                logging.DEBUG, f"txn {txn.id}: ABORTED materialized on {segment} subscription s"
            )
        ),
        what="both materializations logged",
    )


async def _aborted(txn: object) -> bool:
    from segtxn.client import Transaction

    assert isinstance(txn, Transaction)
    return await txn.status() == "ABORTED"


async def test_late_writes_and_wrong_domains_are_refused(client: Client) -> None:
    await client.admin.create_topic(ORDERS, segments=1)
    await client.admin.create_topic("persistent://acme/shop/legacy")
    producer = await client.create_producer(ORDERS)
    txn = await client.transaction().start()
    await producer.send(b"in time", txn=txn)
    await txn.commit()
    with pytest.raises(Exception):  # noqa: B017 - the client refuses a committed txn locally
        await producer.send(b"too late", txn=txn)
    legacy = await client.create_producer("persistent://acme/shop/legacy")
    other = await client.transaction().start()  # v5 (a first send to legacy would pick v4)
    with pytest.raises(ServerError) as mixed:
        await legacy.send(b"x", txn=other)
    assert mixed.value.name is ErrorName.NOT_ALLOWED
    await other.abort()


async def test_a_failed_send_poisons_the_transaction(client: Client, cluster: Cluster) -> None:
    await client.admin.create_topic(ORDERS, segments=1)
    consumer = await client.subscribe(ORDERS, "s", initial_position="earliest")
    producer = await client.create_producer(ORDERS)
    txn = await client.transaction().start()
    await producer.send(b"good", txn=txn)
    cluster.faults.fail("txn", key_prefix="/txn-op/", times=1)  # the op record cannot land
    with pytest.raises(ServerError):
        await producer.send(b"lost", txn=txn)
    with pytest.raises(TransactionFailed):
        await txn.commit()
    assert txn.state == "ABORTED"
    await producer.send(b"after")
    assert [m.value for m in await take(consumer, 1)] == [b"after"]  # no orphan, no "good"
    await nothing_arrives(consumer)


async def test_gc_drains_records_and_late_subscribers_read_correctly(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(ORDERS, segments=2)
    producer = await client.create_producer(ORDERS)
    consumer = await client.subscribe(ORDERS, "live", initial_position="earliest")
    for n in range(6):
        txn = await client.transaction().start()
        for k in range(4):
            await producer.send(f"t{n}-{k}".encode(), key=f"k{k}", txn=txn)
        await (txn.commit() if n % 2 == 0 else txn.abort())
    committed = {f"t{n}-{k}".encode() for n in (0, 2, 4) for k in range(4)}
    assert {m.value for m in await take(consumer, 12)} == committed
    store = cluster.store

    async def drained() -> bool:
        await cluster.coordinator.coordinator.sweep_gc()
        ops = await store.list_prefix(T.OPS)
        headers = await store.list_prefix(T.HEADERS)
        return not ops.records and not headers.records

    await wait_until(drained, timeout=20, what="op records and headers collected")
    late = await client.subscribe(ORDERS, "late", initial_position="earliest")
    assert {m.value for m in await take(late, 12)} == committed  # after GC: still right
    await nothing_arrives(late)


async def test_a_segment_sealed_mid_transaction_still_commits(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(ORDERS, segments=1)
    consumer = await client.subscribe(ORDERS, "s", initial_position="earliest")
    producer = await client.create_producer(ORDERS)
    txn = await client.transaction().start()
    await producer.send(b"before the seal", txn=txn)
    segment = TopicName.parse(ORDERS).segment_name(0)
    topic = cluster.broker.service.topics[segment]
    await topic.ledger.terminate()  # what a split or merge does to a parent
    await asyncio.wait_for(txn.commit(), 5)  # promptly: no marker needs to be written
    assert [m.value for m in await take(consumer, 1)] == [b"before the seal"]


async def test_dropped_watches_miss_no_decision(client: Client, cluster: Cluster) -> None:
    await client.admin.create_topic(ORDERS, segments=2)
    consumer = await client.subscribe(ORDERS, "s", initial_position="earliest")
    producer = await client.create_producer(ORDERS)
    expected = set()
    for n in range(8):
        txn = await client.transaction().start()
        await producer.send(f"m{n}".encode(), key=f"k{n}", txn=txn)
        cluster.faults.drop_watches()  # the header watch breaks right before the decision
        await txn.commit()
        expected.add(f"m{n}".encode())
    assert {m.value for m in await take(consumer, 8)} == expected


async def test_transaction_metrics(client: Client, cluster: Cluster) -> None:
    import aiohttp

    await client.admin.create_topic(ORDERS, segments=1)
    producer = await client.create_producer(ORDERS)
    async with client.transaction() as txn:  # committed by its only broker
        await producer.send(b"m", txn=txn)
    async with Client(cluster.url, one_step_commit=False) as two_step:  # by END_TXN
        other = await two_step.create_producer(ORDERS)
        async with two_step.transaction() as txn:
            await other.send(b"n", txn=txn)
    coordinator_url = cluster.coordinator.settings.advertise_url
    async with aiohttp.ClientSession() as http:
        async with http.get(coordinator_url + "/metrics") as response:
            coordinator = await response.text()
        async with http.get(cluster.url + "/metrics") as response:
            broker = await response.text()
    assert 'segtxn_txn_metadata_store_header_cas_total{result="ok"} 1.0' in coordinator
    assert "segtxn_txn_metadata_store_outstanding_op_records" in coordinator
    assert re.search(
        r'segtxn_txn_metadata_store_op_writes_total\{[^}]*kind="write"[^}]*\} 2\.0', broker
    )
    assert 'segtxn_txn_one_step_commits_total{answer="committed",via="frame"} 1.0' in broker


async def test_retention_trims_the_aborted_index_with_the_data(
    cluster: Cluster, client: Client
) -> None:
    await client.admin.create_topic(ORDERS, segments=1)
    producer = await client.create_producer(ORDERS)
    consumer = await client.subscribe(ORDERS, "s", initial_position="earliest")
    txn = await client.transaction().start()
    await producer.send(b"aborted", txn=txn)
    await txn.abort()
    await producer.send(b"kept")
    assert [m.value for m in await take(consumer, 1)] == [b"kept"]
    segment = TopicName.parse(ORDERS).segment_name(0)
    prefix = "/txn-aborted/"
    await wait_until(
        lambda: _has(cluster, prefix), what="the abort recorded in the segment's index"
    )
    await cluster.broker.service.unload(segment)  # reloading starts a fresh ledger, so
    topic = await cluster.broker.service.serve(segment)  # the consumed one can be trimmed
    week = cluster.broker.settings.retention.retention_time_s
    result = await topic.trim(now_s=time.time() + week)  # ...once retention's week is over
    assert result.ledgers == [1]
    assert not await _has(cluster, prefix)


async def _has(cluster: Cluster, prefix: str) -> bool:
    return bool((await cluster.store.list_prefix(prefix)).records)


async def test_a_reader_with_an_end_stops_there_even_after_aborted_entries(
    client: Client,
) -> None:
    """``end=latest`` is the last entry stored when the reader connects, visible or not: a
    reader whose range ends in an aborted transaction still ends (TopicEnded), and does not
    see what is stored after its end."""
    await client.admin.create_topic(ORDERS, segments=1)
    segment = str(TopicName.parse(ORDERS).segment_name(0))
    producer = await client.create_producer(ORDERS)
    await producer.send(b"committed", key="k")
    async with client.transaction() as txn:
        await producer.send(b"in-commit", key="k", txn=txn)
    txn = await client.transaction().start()
    await producer.send(b"aborted", key="k", txn=txn)
    await txn.abort()

    reader = await client.create_reader(segment, start="earliest", end="latest")
    await producer.send(b"after-the-end", key="k")
    got = [(await reader.receive(timeout_s=10)).value for _ in range(2)]
    assert got == [b"committed", b"in-commit"]
    with pytest.raises(TopicEnded):
        await reader.receive(timeout_s=10)
    with pytest.raises(TopicEnded):  # and it stays ended
        await reader.receive(timeout_s=10)

    empty = await client.create_reader(segment, start="latest", end="latest")
    with pytest.raises(TopicEnded):
        await empty.receive(timeout_s=10)
    with pytest.raises(ServerError) as bad:
        await client.create_reader(segment, end="tomorrow")
    assert bad.value.name is ErrorName.INVALID_ARGUMENT and "end" in bad.value.message


async def test_a_reader_with_an_end_inside_a_read_batch_stops_at_that_entry(
    client: Client,
) -> None:
    """A reader's ``end`` is checked entry by entry: with ``end`` in the middle of what one
    read batch returns, the reader gets up to ``end`` inclusive and then TopicEnded."""
    await client.admin.create_topic(ORDERS, segments=1)
    segment = str(TopicName.parse(ORDERS).segment_name(0))
    producer = await client.create_producer(ORDERS)
    for i in range(10):
        await producer.send(f"m{i}".encode(), key="k")
    whole = await client.create_reader(segment, start="earliest")
    ids = [(await whole.receive(timeout_s=10)).message_id for _ in range(10)]
    end = ids[3]

    reader = await client.create_reader(
        segment, start="earliest", end=f"{end.ledger_id}:{end.entry_id}"
    )
    got = [(await reader.receive(timeout_s=10)).value for _ in range(4)]
    assert got == [b"m0", b"m1", b"m2", b"m3"]
    with pytest.raises(TopicEnded):
        await reader.receive(timeout_s=10)


async def test_a_new_owner_waits_for_the_old_owners_transaction(client: Client) -> None:
    """Exclusive: A acks m0 in an open transaction and leaves. B gets nothing until that
    transaction ends; when it aborts, m0 comes back first, then m1: per-key order holds."""
    await client.admin.create_topic(ORDERS, segments=1)
    producer = await client.create_producer(ORDERS)
    for i in range(2):
        await producer.send(f"m{i}".encode(), key="k")
    a = await client.subscribe(ORDERS, "ordered", initial_position="earliest")
    m0 = await a.receive(timeout_s=10)
    txn = await client.transaction().start()
    await a.acknowledge(m0, txn=txn)
    await a.close()
    b = await client.subscribe(ORDERS, "ordered", initial_position="earliest")
    await nothing_arrives(b)  # fenced: m1 must not overtake the in-doubt m0
    await txn.abort()
    assert [m.value for m in await take(b, 2)] == [b"m0", b"m1"]


async def test_a_member_that_lost_its_turn_cannot_hold_a_message_in_a_transaction(
    client: Client,
) -> None:
    """Failover: "b" took m0, then "a" (first by name) joined and owns the segment. b's late
    transactional ack of m0 is refused, so a delivers m0 before m1."""
    await client.admin.create_topic(ORDERS, segments=1)
    producer = await client.create_producer(ORDERS)
    for i in range(2):
        await producer.send(f"m{i}".encode(), key="k")
    b = await client.subscribe(
        ORDERS, "fo", subscription_type="Failover", initial_position="earliest", name="b"
    )
    m0 = await b.receive(timeout_s=10)
    a = await client.subscribe(
        ORDERS, "fo", subscription_type="Failover", initial_position="earliest", name="a"
    )
    await wait_until(lambda: not b.active, timeout=5, what="b to stand by")
    txn = await client.transaction().start()
    with pytest.raises(ServerError) as refused:
        await b.acknowledge(m0, txn=txn)
    assert refused.value.name is ErrorName.TRANSACTION_CONFLICT
    await txn.abort()
    assert [m.value for m in await take(a, 2)] == [b"m0", b"m1"]
