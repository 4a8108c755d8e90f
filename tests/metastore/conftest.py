"""Fixtures of the metadata store conformance suite: every test runs on every backend."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable

import pytest

from segtxn.metastore import MetadataStore, StoreSettings, open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.metastore.faults import FaultInjector
from segtxn.metastore.memory import MemoryEngine

_namespaces = itertools.count()

MakeStore = Callable[[], MetadataStore]


@pytest.fixture(params=["memory", "etcd"])
async def make_store(
    request: pytest.FixtureRequest,
) -> AsyncIterator[Callable[[], MetadataStore]]:
    """A factory of store clients that all see the same data (one backend per test).

    Each client's engine is wrapped in a FaultInjector, reachable as ``store.engine`` (and
    as the suite's ``faults`` fixture, for the ``store`` here).
    """
    clients: list[MetadataStore] = []
    settings = StoreSettings(watch_retry_max_s=0.2)
    if request.param == "memory":
        shared = MemoryEngine()

        def make() -> MetadataStore:
            store = MetadataStore(FaultInjector(shared), settings, owns_engine=False)
            clients.append(store)
            return store

    else:
        server: EtcdServer = request.getfixturevalue("etcd_server")
        url = server.url(f"/t{os.getpid()}-{next(_namespaces)}")

        def make() -> MetadataStore:
            store = open_store(url, settings, wrap=FaultInjector)
            clients.append(store)
            return store

    yield make
    for store in clients:
        await store.close()
    if request.param == "memory":
        await shared.close()


@pytest.fixture
def store(make_store: MakeStore) -> MetadataStore:
    return make_store()
