"""A broker's directory of storage nodes: who is alive, and where each one is, also while
the metadata store does not answer (a soak run with an etcd restart lost a segment's
writes when every replica append asked the store where its replica was)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from segtxn.broker.replication import BrokerNodes
from segtxn.ledger.replicas import (
    HttpReplica,
    LocalReplica,
    Member,
    ReplicaNode,
    ReplicaUnavailable,
)
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.faults import FaultInjector
from segtxn.topics import nodes as nodes_module
from segtxn.topics.catalog import BROKERS, Catalog


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    async with open_store("memory://", wrap=FaultInjector) as s:
        yield s


def faults(store: MetadataStore) -> FaultInjector:
    assert isinstance(store.engine, FaultInjector)
    return store.engine


async def test_alive_nodes_are_the_registered_brokers_with_a_storage_node(
    store: MetadataStore, tmp_path: Path
) -> None:
    catalog = Catalog(store)
    session = await store.open_session(10)
    await catalog.register_broker("b1", "http://b1:1", session, instance="i1")
    await catalog.register_broker("b2", "http://b2:1", session)  # replication off there
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    nodes = BrokerNodes(catalog, node, "b0", timeout_s=1)
    await nodes.start()
    try:
        assert await nodes.alive() == [Member("b1", "i1")]
        assert isinstance(nodes.replica(Member("b0", node.instance)), LocalReplica)
        assert isinstance(nodes.replica(Member("b1", "i1")), HttpReplica)
    finally:
        await nodes.close()
        node.close()
        await session.close()


async def test_a_known_url_is_used_while_the_store_does_not_answer(
    store: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodes_module, "URL_TTL_S", 0.0)  # every call would ask the store
    catalog = Catalog(store)
    session = await store.open_session(10)
    await catalog.register_broker("b1", "http://b1:1", session, instance="i1")
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    nodes = BrokerNodes(catalog, node, "b0", timeout_s=1)
    try:
        assert await nodes._locate("b1") == "http://b1:1"
        faults(store).fail("range", key_prefix=BROKERS, times=None)
        assert await nodes._locate("b1") == "http://b1:1"  # the last one known
        with pytest.raises(ReplicaUnavailable, match="where broker b9 is"):
            await nodes._locate("b9")  # never known: the replica is unavailable, named
        faults(store).clear()
        assert await nodes._locate("b9") is None  # (not registered)
    finally:
        node.close()
        await session.close()
