"""A coordinator whose session expired (the store unreachable for its TTL; here: its leases
revoked) registers again and serves: v4 ids, like v5's, are campaigned for with a new
session. Before, the campaign ended for good and no transaction could start."""

from __future__ import annotations

import pytest

from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.metastore import MetadataStore
from segtxn.metastore.faults import FaultInjector
from segtxn.metastore.memory import MemoryEngine
from segtxn.metastore.settings import StoreSettings
from tests.waiting import wait_until


@pytest.mark.parametrize("ids", [1, 2])
async def test_a_v4_coordinator_whose_session_expired_holds_its_ids_again(ids: int) -> None:
    faults = FaultInjector(MemoryEngine())
    store = MetadataStore(faults, StoreSettings(), owns_engine=True)
    settings = CoordinatorSettings(
        advertise_url="http://127.0.0.1:1", v4_coordinator_ids=ids, session_ttl_s=1
    )
    coordinator = CoordinatorV4(store, settings)
    await coordinator.start()
    try:
        await wait_until(lambda: len(coordinator.held) == ids, timeout=10, what="ids held")
        first = coordinator.ids.session  # the state under test
        assert await faults.expire_sessions() >= 1
        await wait_until(
            lambda: coordinator.ids.session is not first and len(coordinator.held) == ids,
            timeout=10,
            what="the ids held again on a new session",
        )
    finally:
        await coordinator.stop()
        await store.close()
