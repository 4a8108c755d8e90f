"""v4 (PIP-31) transactions on persistent:// topics: markers, the coordinator's log,
pending acks in a managed ledger, and PIP-373's property; on both stores."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import pytest

from segtxn.broker.txn.markers import CONTAINS_TXN, MarkerTransactionBuffer
from segtxn.client import Client, ServerError
from segtxn.coordinator.app import V4
from segtxn.protocol.errors import ErrorName
from tests.cluster import Cluster
from tests.waiting import wait_until

T1 = "persistent://acme/v4/t1"
T2 = "persistent://acme/v4/t2"


async def receive_all(consumer: object, n: int, timeout_s: float = 10) -> list[bytes]:
    out = []
    for _ in range(n):
        message = await consumer.receive(timeout_s=timeout_s)  # type: ignore[attr-defined]
        out.append(message.value)
        await consumer.acknowledge(message)  # type: ignore[attr-defined]
    return out


async def end(client: Client, txn: str, action: str) -> dict[str, object]:
    """END_TXN by hand (the client refuses to end an ended transaction itself)."""
    url = (await client.connector.request("GET", "/lookup/v2/coordinators"))["coordinators"][0]
    path = f"{url}/txn/v2/{txn}/end"
    return dict(await client.connector.request("POST", path, params={"action": action}))


async def nothing_more(consumer: object) -> None:
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout_s=0.3)  # type: ignore[attr-defined]  # bounded absence


def buffer(cluster: Cluster, topic: str) -> MarkerTransactionBuffer:
    loaded = [t for n, t in cluster.broker.service.topics.items() if str(n) == topic]
    assert loaded and isinstance(loaded[0].buffer, MarkerTransactionBuffer)
    return loaded[0].buffer


async def test_commit_across_topics_is_visible_and_abort_is_not(client: Client) -> None:
    for topic in (T1, T2):
        await client.admin.create_topic(topic)
    consumers = [await client.subscribe(t, "s", initial_position="earliest") for t in (T1, T2)]
    producers = [await client.create_producer(t) for t in (T1, T2)]
    async with client.transaction() as txn:
        for producer in producers:
            await producer.send(b"committed", txn=txn)
    assert not txn.id.is_v5  # picked by the topics' domain
    aborted = client.transaction()
    for producer in producers:
        await producer.send(b"aborted", txn=aborted)
    await aborted.abort()
    await producers[0].send(b"plain")
    assert await receive_all(consumers[0], 2) == [b"committed", b"plain"]
    assert await receive_all(consumers[1], 1) == [b"committed"]
    for consumer in consumers:  # markers and aborted messages are never delivered
        await nothing_more(consumer)
    assert await txn.status() == "COMMITTED" and await aborted.status() == "ABORTED"


async def test_read_committed_holds_everything_behind_an_open_transaction(client: Client) -> None:
    await client.admin.create_topic(T1)
    consumer = await client.subscribe(T1, "s", initial_position="earliest")
    producer = await client.create_producer(T1)
    txn = client.transaction()
    await producer.send(b"in-txn", txn=txn)
    await producer.send(b"after")
    await nothing_more(consumer)  # max_read_position stays before the open transaction
    await txn.commit()
    assert await receive_all(consumer, 2) == [b"in-txn", b"after"]


async def test_pending_acks_conflict_commit_and_abort(client: Client, cluster: Cluster) -> None:
    await client.admin.create_topic(T1)
    producer = await client.create_producer(T1)
    consumer = await client.subscribe(
        T1, "s", initial_position="earliest", subscription_type="Shared"
    )
    for i in range(2):
        await producer.send(f"m{i}".encode())
    first, second = [await consumer.receive(timeout_s=10) for _ in range(2)]
    holder = client.transaction()
    await consumer.acknowledge(first, txn=holder)
    other = client.transaction()
    with pytest.raises(ServerError) as conflict:
        await consumer.acknowledge(first, txn=other)
    assert conflict.value.name is ErrorName.TRANSACTION_CONFLICT
    await other.abort()
    await holder.commit()
    aborting = client.transaction()
    await consumer.acknowledge(second, txn=aborting)
    await aborting.abort()
    again = await consumer.receive(timeout_s=10)  # released by the abort: delivered again
    assert again.value == b"m1"
    await consumer.acknowledge(again)
    stats = await client.admin.stats(T1)
    assert stats["subscriptions"]["s"]["backlog"] == 0


async def test_end_txn_rules_and_timeout(client: Client) -> None:
    await client.admin.create_topic(T1)
    producer = await client.create_producer(T1)
    txn = client.transaction()
    await producer.send(b"x", txn=txn)
    await txn.commit()
    again = await end(client, str(txn.id), "COMMIT")  # the same END again: fine
    assert again["state"] == "COMMITTED"
    with pytest.raises(ServerError) as refused:
        await end(client, str(txn.id), "ABORT")  # the opposite one
    assert refused.value.name is ErrorName.INVALID_TXN_STATUS
    slow = client.transaction(timeout_s=0.3)
    await producer.send(b"too-slow", txn=slow)

    async def aborted() -> bool:
        return await slow.status() == "ABORTED"

    await wait_until(aborted, timeout=10, what="the timeout sweep aborting it")
    consumer = await client.subscribe(T1, "s", initial_position="earliest")
    assert await receive_all(consumer, 1) == [b"x"]
    await nothing_more(consumer)


async def test_v4_and_v5_never_mix(client: Client) -> None:
    await client.admin.create_topic(T1)
    await client.admin.create_topic("topic://acme/v5/s", segments=1)
    v4 = await client.create_producer(T1)
    v5 = await client.create_producer("topic://acme/v5/s")
    txn = client.transaction()
    await v4.send(b"a", txn=txn)
    with pytest.raises(ServerError) as mixed:
        await v5.send(b"b", key="k", txn=txn)
    assert mixed.value.name is ErrorName.NOT_ALLOWED and "never mix" in mixed.value.message
    await txn.abort()
    other = client.transaction()
    await v5.send(b"b", key="k", txn=other)
    with pytest.raises(ServerError) as mixed_again:
        await v4.send(b"a", txn=other)
    assert mixed_again.value.name is ErrorName.NOT_ALLOWED
    await other.abort()


async def test_commit_on_a_terminated_topic_fails_at_once(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """The problem PIP-471 solves: a sealed topic cannot take its commit marker (and the
    coordinator's log says which participant refused what)."""
    caplog.set_level(logging.INFO, logger="segtxn")
    await client.admin.create_topic(T1)
    producer = await client.create_producer(T1)
    txn = client.transaction()
    await producer.send(b"x", txn=txn)
    await client.admin.terminate(T1)
    started = time.monotonic()
    with pytest.raises(ServerError) as refused:
        await txn.commit()
    assert refused.value.name is ErrorName.TOPIC_TERMINATED
    assert time.monotonic() - started < 2  # promptly, not after the fan-out timeout
    assert await txn.status() == "COMMITTING"
    refusals = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "segtxn.coordinator.fanout"
    ]
    assert refusals == [
        f"txn {txn.id}: COMMIT refused by participant {T1} (TopicTerminatedError): "
        + refused.value.message
    ]


async def test_recovery_stops_at_a_terminated_topics_refusal(
    client: Client, cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Recovery tries a decided transaction again while a participant's refusal may pass
    (a PersistenceError: tests/txn/test_cursor_repair_acks.py), not after one no try can
    change: a terminated topic refuses the marker once, said at WARNING, and the
    transaction stays COMMITTING, with no tries after it."""
    caplog.set_level(logging.INFO, logger="segtxn.coordinator")
    await client.admin.create_topic(T1)
    producer = await client.create_producer(T1)
    txn = client.transaction()
    await producer.send(b"x", txn=txn)
    await client.admin.terminate(T1)
    with pytest.raises(ServerError):
        await txn.commit()
    await cluster.coordinator.app[V4].stop()  # the process goes; its log stays
    from segtxn.coordinator.v4 import CoordinatorV4

    successor = CoordinatorV4(cluster.store, cluster.coordinator.settings)
    await successor.start()
    gave_up = f"txn {txn.id}: finishing its COMMIT refused for good: TopicTerminatedError: "
    try:
        await wait_until(
            lambda: any(r.getMessage().startswith(gave_up) for r in caplog.records),
            what="the recovered commit refused for good",
        )
        meta = successor.held[txn.id.most].txns[txn.id.least]
        assert meta.state == "COMMITTING"
        finishing = f"v4-finish-{txn.id.least:x}"  # (the recovery's task: ended, not pausing)
        await wait_until(
            lambda: all(t.get_name() != finishing for t in asyncio.all_tasks()),
            what="the recovery's finishing ended",
        )
        tries = [r for r in caplog.records if f"txn {txn.id}: finishing its" in r.getMessage()]
        assert len(tries) == 1, [r.getMessage() for r in tries]
        await client.close(timeout_s=1)  # (its txn is COMMITTING: no coordinator serves it)
    finally:
        await successor.stop()


async def test_a_participant_deleted_before_the_commit_does_not_hold_it_up(
    client: Client,
) -> None:
    """Its topic and what the transaction wrote there are gone: the commit finishes with the
    other participants (it used to stay COMMITTING for good, refused its abort too)."""
    await client.admin.create_topic(T1)
    await client.admin.create_topic(T2)
    kept, doomed = await client.create_producer(T1), await client.create_producer(T2)
    consumer = await client.subscribe(T1, "s", initial_position="earliest")
    txn = client.transaction()
    await kept.send(b"kept", txn=txn)
    await doomed.send(b"doomed", txn=txn)
    await client.admin.delete_topic(T2, force=True)
    await txn.commit()
    assert await txn.status() == "COMMITTED"
    assert await receive_all(consumer, 1) == [b"kept"]


async def test_a_topic_that_does_not_exist_cannot_join(client: Client) -> None:
    txn = await client.transaction().start("v4")
    url = (await client.connector.request("GET", "/lookup/v2/coordinators"))["coordinators"][0]
    for command, body in (
        ("partitions", {"topics": ["persistent://acme/v4/never"]}),
        ("subscriptions", {"topics": ["persistent://acme/v4/never"], "subscription": "s"}),
    ):
        with pytest.raises(ServerError) as refused:
            await client.connector.request("POST", f"{url}/txn/v2/{txn.id}/{command}", json=body)
        assert refused.value.name is ErrorName.TOPIC_NOT_FOUND
        assert refused.value.message == "topic persistent://acme/v4/never does not exist"
    await txn.abort()  # nothing joined: it ends at once
    assert await txn.status() == "ABORTED"


async def test_pip373_property(client: Client, cluster: Cluster) -> None:
    await client.admin.create_topic(T1)
    producer = await client.create_producer(T1)
    await producer.send(b"plain")
    assert (await client.admin.properties(T1)).get(CONTAINS_TXN) == "false"  # found out at load
    assert buffer(cluster, T1).contains_txn is False
    txn = client.transaction()
    await producer.send(b"x", txn=txn)  # acknowledged only once the property is durable
    assert (await client.admin.properties(T1))[CONTAINS_TXN] == "true"
    await txn.commit()
    for change in (
        client.admin.update_properties(T1, {CONTAINS_TXN: "false"}),
        client.admin.remove_property(T1, CONTAINS_TXN),
    ):
        with pytest.raises(ServerError) as refused:
            await change
        assert refused.value.name is ErrorName.NOT_ALLOWED
    metrics = cluster.broker.service.metrics.render().decode().splitlines()
    gauge = [line for line in metrics if line.startswith("segtxn_broker_topics_with_txns")]
    assert len(gauge) == 1 and gauge[0].endswith(" 1.0"), gauge


async def test_coordinator_recovers_from_its_log_and_finishes_the_commit(
    cluster: Cluster, client: Client
) -> None:
    """The participant is unreachable during the fan-out: END_TXN answers
    ServiceNotReady with COMMITTING logged; a new coordinator (the old one gone) replays the
    log and finishes it once the participant is back."""
    await client.admin.create_topic(T1)
    consumer = await client.subscribe(T1, "s", initial_position="earliest")
    producer = await client.create_producer(T1)
    txn = client.transaction()
    await producer.send(b"x", txn=txn)
    v4 = cluster.coordinator.app[V4]
    participants = v4.participants
    assert participants is not None  # the coordinator has started
    fan_out = participants.call

    async def unreachable(*_: object) -> None:
        raise ServerError(ErrorName.SERVICE_NOT_READY, "broker unreachable")

    participants.call = unreachable  # type: ignore[method-assign, assignment]  # a stand-in
    with pytest.raises(ServerError) as pending:  # once, by hand (the client would retry)
        await end(client, str(txn.id), "COMMIT")
    assert pending.value.name is ErrorName.SERVICE_NOT_READY
    assert await txn.status() == "COMMITTING"
    await nothing_more(consumer)
    participants.call = fan_out  # type: ignore[method-assign]  # the real one back
    await v4.stop()  # the process goes; its log stays
    from segtxn.coordinator.v4 import CoordinatorV4

    successor = CoordinatorV4(cluster.store, cluster.coordinator.settings)
    await successor.start()
    try:
        await wait_until(
            lambda: txn.id.most in successor.held, timeout=10, what="its id taken over"
        )
        assert successor.counters["replayed"] >= 3  # OPEN, +partition, COMMITTING
        assert await receive_all(consumer, 1) == [b"x"]  # the marker, written by recovery

        def committed() -> bool:
            return any(
                m.state == "COMMITTED" for h in successor.held.values() for m in h.txns.values()
            )

        await wait_until(committed, timeout=10, what="COMMITTED logged")
        # the client's txn is still open to it (it was ended by hand), and no coordinator
        # that it can reach holds the id (the successor serves no HTTP): bound its abort at
        # close, or it is retried for the whole operation timeout
        await client.close(timeout_s=1)
    finally:
        await successor.stop()


async def restart_broker(cluster: Cluster, **changes: int) -> None:
    """Stop the broker and start another on the same store and ledger files (with
    ``changes`` to its settings)."""
    from segtxn.broker.app import BrokerServer

    settings = dataclasses.replace(cluster.broker.settings, **changes)  # type: ignore[arg-type]
    await cluster.broker.stop()
    cluster.broker = BrokerServer(settings, store=cluster.store)
    await cluster.broker.start()


async def loaded(cluster: Cluster, topic: str) -> MarkerTransactionBuffer:
    async with Client(cluster.url) as client:
        await client.admin.stats(topic)  # loads it
    return buffer(cluster, topic)


async def test_recovery_replays_the_ledger_then_uses_snapshots(cluster: Cluster) -> None:
    async with Client(cluster.url) as client:
        await client.admin.create_topic(T1)
        producer = await client.create_producer(T1)
        committed, aborted, open_ = (client.transaction() for _ in range(3))
        for txn, value in ((committed, b"c"), (aborted, b"a"), (open_, b"o")):
            await producer.send(value, txn=txn)
        await committed.commit()
        await aborted.abort()
        await restart_broker(cluster)
        first = await loaded(cluster, T1)
        assert first.recovery == {"snapshot": 0, "replayed": 5, "skipped": 0}  # 3 + 2 markers
        assert first.ongoing == {open_.id}
        await first.snapshot()
        late = client.transaction()
        await producer.send(b"late", txn=late)
        await restart_broker(cluster)
        second = await loaded(cluster, T1)
        assert second.recovery["snapshot"] == 1
        assert second.recovery["replayed"] == 1  # only what came after the snapshot
        assert second.ongoing == {open_.id, late.id}
        await client.close(timeout_s=0)  # leaves them open (a close that waits aborts them)
    async with Client(cluster.url) as client:
        consumer = await client.subscribe(T1, "s", initial_position="earliest")
        assert await receive_all(consumer, 1) == [b"c"]
        await nothing_more(consumer)  # the open transaction holds everything after it
        await end(client, str(open_.id), "COMMIT")
        await end(client, str(late.id), "ABORT")
        assert await receive_all(consumer, 1) == [b"o"]
        await nothing_more(consumer)


def metric(cluster: Cluster, name: str) -> float:
    lines = cluster.broker.service.metrics.render().decode().splitlines()
    found = [line for line in lines if line.startswith(name)]
    assert len(found) == 1, found
    return float(found[0].rsplit(" ", 1)[1])


async def test_the_snapshot_log_keeps_the_latest_snapshot_and_what_follows(
    cluster: Cluster,
) -> None:
    """Snapshots beyond ``txn_log_compact_entries`` compact the namespace's snapshot log
    (counted, and the log's size exported); after a restart the topic recovers from its
    latest snapshot, replaying only what followed it."""
    async with Client(cluster.url) as client:
        await client.admin.create_topic(T1)
        producer = await client.create_producer(T1)
        open_ = client.transaction()
        await producer.send(b"o", txn=open_)
        await restart_broker(cluster, txn_log_compact_entries=10)
        first = await loaded(cluster, T1)
        for _ in range(35):
            await first.snapshot()
        compactions = 'segtxn_txn_v4_log_compactions_total{log="snapshot"'
        # one before the 11th, the 20th and the 29th snapshot (each leaves the topic's
        # latest copied past its cut: 9 more make the next 10)
        assert metric(cluster, compactions) == 3
        assert metric(cluster, "segtxn_txn_v4_snapshot_log_entries") == 1 + 7
        late = client.transaction()
        await producer.send(b"late", txn=late)
        await restart_broker(cluster, txn_log_compact_entries=10)
        second = await loaded(cluster, T1)
        assert second.recovery["snapshot"] == 1
        assert second.recovery["replayed"] == 1  # only what came after the latest snapshot
        assert second.ongoing == {open_.id, late.id}
        await end(client, str(open_.id), "ABORT")
        await end(client, str(late.id), "ABORT")


async def test_pip373_skips_recovery_and_handles_upgrades(cluster: Cluster) -> None:
    plain, txns = T1, T2
    async with Client(cluster.url) as client:
        for topic in (plain, txns):
            await client.admin.create_topic(topic)
        await (await client.create_producer(plain)).send(b"p")
        producer = await client.create_producer(txns)
        aborted = client.transaction()
        await producer.send(b"aborted", txn=aborted)
        await aborted.abort()
    await restart_broker(cluster)
    assert (await loaded(cluster, plain)).recovery == {"snapshot": 0, "replayed": 0, "skipped": 1}

    async def set_raw(value: str | None) -> None:
        """What an older broker, or a user before PIP-373, left in the ledger's metadata."""
        ledger = (await loaded(cluster, txns))._ledger
        if value is None:
            await ledger.update_properties({}, (CONTAINS_TXN,))
        else:
            await ledger.update_properties({CONTAINS_TXN: value}, ())
        await restart_broker(cluster)

    await set_raw(None)  # absent: found out by scanning, and recorded
    upgraded = await loaded(cluster, txns)
    assert upgraded.recovery["replayed"] == 2 and upgraded.contains_txn
    assert upgraded._ledger.properties[CONTAINS_TXN] == "true"
    await set_raw("yes please")  # not a boolean: rebuilt every time, never rewritten
    odd = await loaded(cluster, txns)
    assert odd.recovery["replayed"] == 2 and odd._ledger.properties[CONTAINS_TXN] == "yes please"
    async with Client(cluster.url) as client:
        with pytest.raises(ServerError) as refused:
            await client.admin.update_properties(txns, {CONTAINS_TXN: "true"})
        assert refused.value.name is ErrorName.NOT_ALLOWED
    await set_raw("false")  # a user's boolean is trusted like the system's own
    assert (await loaded(cluster, txns)).recovery["skipped"] == 1


async def test_bad_v4_requests_get_clear_errors(client: Client, cluster: Cluster) -> None:
    await client.admin.create_topic(T1)
    base = "/admin/v2/persistent/acme/v4/t1"
    for path, params, error in (
        (f"{base}/txn/zz/end", {"action": "COMMIT"}, ErrorName.INVALID_ARGUMENT),
        (f"{base}/txn/0:1/end", {"action": "MAYBE"}, ErrorName.INVALID_ARGUMENT),
        (f"{base}/txn/1000000000000:1/end", {"action": "COMMIT"}, ErrorName.NOT_ALLOWED),
        (
            "/admin/v2/persistent/acme/v4/nope/txn/0:1/end",
            {"action": "ABORT"},
            ErrorName.TOPIC_NOT_FOUND,
        ),
    ):
        with pytest.raises(ServerError) as refused:
            await client.connector.request("POST", path, params=params)
        assert refused.value.name is error, path
    # An END for a transaction that never wrote here is a harmless no-op (idempotent).
    await client.connector.request("POST", f"{base}/txn/0:99/end", params={"action": "ABORT"})
    for txn, error in (
        ("1:5", ErrorName.TRANSACTION_NOT_FOUND),
        ("0:7777", ErrorName.TRANSACTION_NOT_FOUND),
    ):
        with pytest.raises(ServerError) as unknown:
            await end(client, txn, "COMMIT")
        assert unknown.value.name is error
    stats = await client.admin.stats(T1)  # the broker is fine
    assert stats is not None
