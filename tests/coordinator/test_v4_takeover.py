"""A v4 coordinator whose take-over of an id fails (its log cannot be recovered there) lets
the id go before it tries again, so that a coordinator able to recover the log takes it.
Before, the failing one campaigned again on the same session and retook its own key at once
(a campaign takes a key its session holds), for ever: the id was held by a coordinator that
could not serve it, and its transactions were never finished. And a stop lets go of an id
won but not serving (kept after a failed letting go, or being recovered), as it does those held."""

from __future__ import annotations

import asyncio

import pytest

from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.coordinator.v4ids import ELECTION_PREFIX
from segtxn.ledger import LedgerError
from segtxn.metastore import Leadership, MetadataStore, open_store
from segtxn.metastore.election import ELECTIONS_PREFIX
from segtxn.metastore.etcd_server import free_port
from segtxn.metastore.faults import FaultInjector, Tally
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


ELECTION_KEY = ELECTIONS_PREFIX + ELECTION_PREFIX + "0"


@pytest.mark.parametrize("revoke", ["revoked", "refused"])
@pytest.mark.parametrize("when", ["kept", "recovering"])
async def test_a_stop_lets_an_id_won_but_not_serving_go_at_once(
    store: MetadataStore, faults: FaultInjector, when: str, revoke: str
) -> None:
    """Id 0 is won but not serving when the coordinator stops: ``kept``, its take-over
    failed and letting it go failed too (the store refused the delete; the next take-over
    is to be made with it), or ``recovering``, its log being replayed. The store is back
    for the stop, but (``refused``) it does not revoke the session's lease (the store
    answering the deletes but not that, or the stop's time up by then): the stop's own
    resignations are then all that frees the ids at once. The id is free once the stop
    returns (its election key gone) for another coordinator to take it. The stop resigned
    only the ids held (serving): one won and not serving stayed blocked for every other
    coordinator until the lease expired (``session_ttl_s``)."""
    coordinator = CoordinatorV4(store, _settings())
    tries = 0
    resigns: Tally | None = None
    """The deletes of id 0's election key from the first failed take-over on."""

    async def recover(coordinator_id: int, leadership: Leadership) -> None:
        nonlocal tries, resigns
        tries += 1
        if when == "kept" and tries == 1:
            faults.fail("txn", key_prefix=ELECTION_KEY, times=None)  # letting it go: refused
            resigns = faults.count("txn", key_prefix=ELECTION_KEY)
            raise LedgerError(f"injected: the log of id {coordinator_id} cannot be read here")
        await asyncio.Event().wait()  # a replay that takes long (the stop cancels it)

    coordinator.ids._recover = recover  # type: ignore[method-assign,assignment]
    await coordinator.start()
    try:
        if when == "kept":  # (the next take-over, a second later, is made with it)
            await wait_until(lambda: bool(resigns and resigns.calls), what="id 0 kept")
        else:
            await wait_until(lambda: tries == 1, what="id 0's log being recovered")
        assert 0 not in coordinator.held
        assert await store.get(ELECTION_KEY) is not None  # won by this coordinator
        faults.clear()  # the store is back
        if revoke == "refused":
            faults.fail("lease_revoke", times=None)
    finally:
        await coordinator.stop()
    assert await store.get(ELECTION_KEY) is None, "id 0 still taken after the stop"
