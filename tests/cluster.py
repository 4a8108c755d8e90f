"""Fixture plugin: a transactional cluster in one process, a broker and a v5 coordinator
on one store (loaded by tests/conftest.py, so every test directory can use it).

The store is wrapped in a FaultInjector (``cluster.faults``) so tests can drop watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.broker.txn.headers import HeaderWatch
from segtxn.client import Client, Consumer, Producer, ScalableProducer
from segtxn.coordinator.app import V4, CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.metastore.faults import FaultInjector
from segtxn.web import AppServer, Listener
from tests.waiting import wait_until

V4_IDS = 2
"""v4 coordinator ids of the test cluster's coordinator."""
LOOPBACK = "127.0.0.1"


@dataclass
class Cluster:
    store: MetadataStore
    broker: BrokerServer
    coordinator: CoordinatorServer

    @property
    def url(self) -> str:
        return self.broker.settings.advertise_url

    @property
    def faults(self) -> FaultInjector:
        engine = self.store.engine
        assert isinstance(engine, FaultInjector)
        return engine


async def start_on_free_ports(
    make: Callable[[int, int], tuple[BrokerServer, CoordinatorServer]],
) -> tuple[BrokerServer, CoordinatorServer]:
    """Start a broker and a coordinator made for two loopback ports the system picks.

    Each port is bound (a :class:`~segtxn.web.Listener` on port 0) before the servers are
    made, and the server made for it serves on that very socket: no other process can take
    it meanwhile. (Ports picked by binding a socket and closing it again were free only
    until another process bound them: seen in make test beside other jobs, "address already
    in use".)"""
    with contextlib.ExitStack() as unserved:  # closed unless a server took them
        node = unserved.enter_context(Listener(LOOPBACK))
        txn = unserved.enter_context(Listener(LOOPBACK))
        broker, coordinator = make(node.port, txn.port)
        _serve_on(broker, node)
        _serve_on(coordinator, txn)
        unserved.pop_all()
    return await _start_both(broker, coordinator)


def _serve_on(server: AppServer, listener: Listener) -> None:
    """Have ``server`` (made for ``listener``'s port) serve on ``listener``, which it closes
    when it stops."""
    if server.port != listener.port:
        raise ValueError(f"a server made for port {server.port}, not {listener.port}")
    server.listener, server.host = listener, listener.host


async def _start_both(
    broker: BrokerServer, coordinator: CoordinatorServer
) -> tuple[BrokerServer, CoordinatorServer]:
    """Start both, or neither (what started is stopped again)."""
    try:
        await broker.start()
        await coordinator.start()
    except BaseException:
        await coordinator.stop()
        await broker.stop()
        raise
    return broker, coordinator


@pytest.fixture
def header_watch() -> HeaderWatch:
    """How the cluster's broker follows transaction headers (a test module overrides this
    fixture to run its tests in ``scoped`` mode)."""
    return HeaderWatch.PREFIX


@pytest.fixture(params=["memory", "etcd"])
async def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, header_watch: HeaderWatch
) -> AsyncIterator[Cluster]:
    """The same cluster on the embedded store and on a real etcd."""
    if request.param == "memory":
        url = "memory://"
    else:
        server: EtcdServer = request.getfixturevalue("etcd_server")
        url = server.url(f"/txn-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    store = open_store(url, wrap=FaultInjector)

    def servers(port: int, txn_port: int) -> tuple[BrokerServer, CoordinatorServer]:
        broker = BrokerServer(
            BrokerSettings(
                broker_id="b1",
                advertise_url=f"http://127.0.0.1:{port}",
                ledger_url=f"file://{tmp_path / 'ledgers'}",
                consumer_hold_s=1.0,
                header_watch=header_watch,
            ),
            store=store,
        )
        coordinator = CoordinatorServer(
            CoordinatorSettings(
                advertise_url=f"http://127.0.0.1:{txn_port}",
                timeout_sweep_s=0.1,
                gc_sweep_s=3600,
                gc_retention_s=0,
                v4_coordinator_ids=V4_IDS,
                ledger_url=f"file://{tmp_path / 'txn-logs'}",
                fan_out_timeout_s=2.0,
            ),
            store=store,
        )
        return broker, coordinator

    broker, coordinator = await start_on_free_ports(servers)
    # A coordinator serves once it holds an id; tests that inject store faults right away
    # would otherwise race its first campaign (and see "holds no id yet"). Its v4 ids too:
    # a v4 call is ServiceNotReady ("recovering its coordinator") until the id's log is
    # recovered, which a test sending at once could see on a busy machine.
    v4 = coordinator.app[V4]
    async with asyncio.timeout(10):
        await coordinator.coordinator.ready.wait()
    await wait_until(lambda: len(v4.held) == V4_IDS, timeout=10, what="the v4 ids recovered")
    running = Cluster(store, broker, coordinator)
    try:
        yield running
    finally:
        await running.coordinator.stop()
        await running.broker.stop()  # the one running now (a test may have restarted it)
        await store.close()


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[Client]:
    async with Client(cluster.url) as c:
        yield c


async def create_and_send(
    client: Client, topic: str, *values: bytes
) -> Producer | ScalableProducer:
    """Create persistent ``topic`` and store ``values`` in it, in order, through a producer
    returned open (the opening many broker edge tests share)."""
    await client.admin.create_topic(topic)
    producer = await client.create_producer(topic)
    for value in values:
        await producer.send(value)
    return producer


async def acked_in_txn(client: Client, topic: str, subscription: str, *, commit: bool) -> Consumer:
    """Subscribe ``subscription`` (Shared) to ``topic`` from the earliest message and
    acknowledge its first message in a transaction, then committed (or aborted): its v4
    pending-ack log is made (lazily, on a subscription's first transactional ack). Returns
    the consumer, open."""
    consumer = await client.subscribe(
        topic, subscription, initial_position="earliest", subscription_type="Shared"
    )
    txn = client.transaction()
    await consumer.acknowledge(await consumer.receive(timeout_s=10), txn=txn)
    await (txn.commit() if commit else txn.abort())
    return consumer
