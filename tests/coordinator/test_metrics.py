"""The coordinator's and the broker's transaction metrics on a real cluster (broker and
coordinator on one store, in memory and on a real etcd): one shape for both servers, END_TXN
and commit-to-visible latencies, and the stuck-transaction numbers (the oldest open
transaction's age, the entries pinned behind it, the acks it holds)."""

from __future__ import annotations

from segtxn.client import Client
from tests.cluster import Cluster
from tests.metrics_scrape import check_conventions, scrape
from tests.waiting import wait_until

ORDERS = "topic://acme/metrics/orders"
V4_TOPIC = "persistent://acme/metrics/v4"


async def test_both_servers_export_one_shape(cluster: Cluster) -> None:
    coordinator = await scrape(cluster.coordinator.settings.advertise_url)
    broker = await scrape(cluster.url)
    check_conventions(coordinator)
    check_conventions(broker)
    assert coordinator.value("segtxn_build_info", component="coordinator") == 1
    assert broker.value("segtxn_build_info", component="broker") == 1
    assert coordinator.types["segtxn_txn_committed"] == "counter"
    assert coordinator.value("segtxn_txn_coordinator_ids_held") == 4
    assert coordinator.value("segtxn_txn_v4_log_entries", coordinator="0") is not None
    for server, found in ((cluster.coordinator, coordinator), (cluster.broker, broker)):
        # (the scrape's own connection is open: at least one)
        assert (found.value("segtxn_connections_open") or 0) >= 1
        assert found.value("segtxn_connections_limit") == server.gate.max_connections
        assert found.types["segtxn_connections_refused"] == "counter"


async def test_end_txn_and_commit_to_visible_are_timed(cluster: Cluster) -> None:
    async with Client(cluster.url, one_step_commit=False) as client:  # END_TXN's
        await client.admin.create_topic(ORDERS, segments=1)
        producer = await client.create_producer(ORDERS)
        async with client.transaction() as txn:
            await producer.send(b"m", txn=txn)
        aborted = await client.transaction().start()
        await aborted.abort()

        coordinator = await scrape(cluster.coordinator.settings.advertise_url)
        assert coordinator.types["segtxn_txn_end_duration_seconds"] == "histogram"
        commits = coordinator.value(
            "segtxn_txn_end_duration_seconds_count", action="commit", protocol="v5"
        )
        aborts = coordinator.value(
            "segtxn_txn_end_duration_seconds_count", action="abort", protocol="v5"
        )
        assert (commits, aborts) == (1, 1)
        assert coordinator.value("segtxn_txn_committed_total") == 1
        assert coordinator.value("segtxn_txn_metadata_store_header_cas_total", result="ok") == 2

        async def visible() -> bool:
            found = await scrape(cluster.url)
            return found.value("segtxn_txn_commit_to_visible_seconds_count") == 1

        await wait_until(visible, what="the commit to be materialized on the segment")
        broker = await scrape(cluster.url)
        assert (
            broker.value("segtxn_txn_materialized_total", outcome="COMMITTED", part="writes") == 1
        )


async def test_a_stuck_transaction_shows_its_age_and_what_it_pins(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(ORDERS, segments=1)
    consumer = await client.subscribe(ORDERS, "sub", initial_position="earliest")
    producer = await client.create_producer(ORDERS)
    await producer.send(b"before")
    acked = await consumer.receive(timeout_s=5)
    stuck = await client.transaction().start()
    await consumer.acknowledge(acked, txn=stuck)
    await producer.send(b"in-txn", txn=stuck)
    for n in range(3):
        await producer.send(f"after-{n}".encode())  # readable only once `stuck` ends

    found = await scrape(cluster.url)
    segments = {
        s.labels["topic"]
        for s in found.samples
        if s.name == "segtxn_topic_txn_oldest_open_age_seconds"
    }
    assert len(segments) == 1, segments
    segment = segments.pop()
    age = found.value("segtxn_topic_txn_oldest_open_age_seconds", topic=segment)
    assert age is not None and age >= 0
    assert found.value("segtxn_topic_txn_pinned_entries", topic=segment) == 4
    pending = found.value("segtxn_subscription_txn_pending_acks", topic=segment, subscription="sub")
    assert pending == 1
    later = (await scrape(cluster.url)).value(
        "segtxn_topic_txn_oldest_open_age_seconds", topic=segment
    )
    assert later is not None and later >= age

    await stuck.commit()

    async def released() -> bool:
        now = await scrape(cluster.url)
        return (
            now.value("segtxn_topic_txn_oldest_open_age_seconds", topic=segment) is None
            and now.value("segtxn_topic_txn_pinned_entries", topic=segment) == 0
            and now.value("segtxn_subscription_txn_pending_acks", topic=segment, subscription="sub")
            == 0
        )

    await wait_until(released, what="the committed transaction to stop pinning the segment")
    await producer.close()
    await consumer.close()


async def test_a_v4_transaction_on_a_persistent_topic_is_measured_too(
    client: Client, cluster: Cluster
) -> None:
    await client.admin.create_topic(V4_TOPIC)
    producer = await client.create_producer(V4_TOPIC)
    txn = client.transaction()
    await producer.send(b"in-txn", txn=txn)
    await producer.send(b"after")
    await producer.send(b"after")
    found = await scrape(cluster.url)
    assert found.value("segtxn_topic_txn_pinned_entries", topic=V4_TOPIC) == 3
    age = found.value("segtxn_topic_txn_oldest_open_age_seconds", topic=V4_TOPIC)
    assert age is not None and age >= 0
    assert found.value("segtxn_broker_topics_with_txns") == 1

    await txn.commit()
    coordinator = await scrape(cluster.coordinator.settings.advertise_url)
    ended = coordinator.value(
        "segtxn_txn_end_duration_seconds_count", action="commit", protocol="v4"
    )
    assert ended == 1
    after = await scrape(cluster.url)  # the marker is written before END_TXN answers
    assert after.value("segtxn_topic_txn_oldest_open_age_seconds", topic=V4_TOPIC) is None
    assert after.value("segtxn_topic_txn_pinned_entries", topic=V4_TOPIC) == 0
    await producer.close()
