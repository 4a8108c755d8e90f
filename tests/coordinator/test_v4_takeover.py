"""A v4 coordinator whose take-over of an id fails (its log cannot be recovered there) lets
the id go before it tries again, so that a coordinator able to recover the log takes it.
Before, the failing one campaigned again on the same session and retook its own key at once
(a campaign takes a key its session holds), for ever: the id was held by a coordinator that
could not serve it, and its transactions were never finished."""

from __future__ import annotations

from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.coordinator.v4ids import ELECTION_PREFIX
from segtxn.ledger import LedgerError
from segtxn.metastore import Leadership, open_store
from segtxn.metastore.election import ELECTIONS_PREFIX
from segtxn.metastore.etcd_server import free_port
from tests.waiting import wait_until


def _settings() -> CoordinatorSettings:
    return CoordinatorSettings(
        advertise_url=f"http://127.0.0.1:{free_port()}", v4_coordinator_ids=1
    )


async def test_a_failed_take_over_lets_the_id_go_to_a_coordinator_that_can_recover_it() -> None:
    store = open_store("memory://")
    broken = CoordinatorV4(store, _settings())
    failures = 0

    async def cannot_recover(coordinator_id: int, leadership: Leadership) -> None:
        nonlocal failures
        failures += 1
        raise LedgerError(f"the log of id {coordinator_id} cannot be read here")

    broken.ids._recover = cannot_recover  # type: ignore[method-assign,assignment]
    healthy = CoordinatorV4(store, _settings())
    await broken.start()
    try:
        await wait_until(lambda: failures >= 1, what="the broken take-over tried")
        await healthy.start()
        await wait_until(lambda: 0 in healthy.held, timeout=10, what="id 0 held by the other")
        assert 0 not in broken.held
        holder = await store.get(ELECTIONS_PREFIX + ELECTION_PREFIX + "0")
        assert holder is not None
        assert holder.value == healthy.settings.advertise_url.encode()
        await healthy.new_txn()  # and it serves
    finally:
        await healthy.stop()
        await broken.stop()
        await store.close()
