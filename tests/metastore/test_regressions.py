"""Conformance cases from the review of the store: each once failed on some backend."""

from __future__ import annotations

import asyncio

import pytest

from segtxn.metastore import (
    MUST_NOT_EXIST,
    Check,
    Delete,
    InvalidArgument,
    LeaderElection,
    MetadataStore,
    Put,
    SessionExpired,
    TooLarge,
    TooManyOperations,
)
from segtxn.metastore.engine import DeleteOp, PutOp
from segtxn.metastore.faults import FaultInjector
from tests.metastore.conftest import MakeStore
from tests.waiting import wait_until


async def test_partial_delete_range_does_not_reuse_sequence_numbers(store: MetadataStore) -> None:
    for i in range(1, 7):
        await store.put("/q/", b"", sequential=True, indexes={"old": i})
    await store.delete_range("/q/", "/q/" + "5".zfill(20))  # keeps /q/...5 and /q/...6
    nxt = await store.put("/q/", b"new", sequential=True)
    assert nxt.key == "/q/" + "7".zfill(20)
    assert [e.index_key for e in (await store.index_range("old")).entries] == [(5,), (6,)]


async def test_sequential_put_never_overwrites_an_existing_key(make_store: MakeStore) -> None:
    a, b = make_store(), make_store()
    await a.put("/s/", b"1", sequential=True)
    await b.put("/s/" + "2".zfill(20), b"placed by hand", indexes={"i": 1})
    second = await a.put("/s/", b"2", sequential=True)  # a's counter says 2 is next
    assert second.key == "/s/" + "3".zfill(20)
    kept = await b.get("/s/" + "2".zfill(20))
    assert kept is not None and kept.value == b"placed by hand"


async def test_a_stale_cache_does_not_fail_a_valid_step(make_store: MakeStore) -> None:
    a, b = make_store(), make_store()
    await a.put("/k1", b"1")
    await a.put("/k2", b"2")
    fresh = await b.put("/k1", b"changed")  # a's cache of /k1 is now stale
    await a.commit([Check("/k1", fresh.version), Delete("/k2")])

    await a.put("/k3", b"x")
    await a.put("/k4", b"x")
    await b.delete("/k3")  # a still believes /k3 exists
    await a.commit([Put("/k3", b"again", expected_version=MUST_NOT_EXIST), Delete("/k4")])


async def test_delete_range_of_a_heavily_indexed_record(store: MetadataStore) -> None:
    indexes: dict[str, str | int | tuple[str | int, ...]] = {f"i{n}": n for n in range(127)}
    await store.put("/heavy", b"x", indexes=indexes)
    assert await store.delete_range("/heavy") == 1
    assert (await store.index_range("i0")).entries == []


async def test_delete_cannot_expect_absence(store: MetadataStore) -> None:
    with pytest.raises(InvalidArgument):
        await store.delete("/nothing", expected_version=MUST_NOT_EXIST)


async def test_compacting_the_future_is_refused(store: MetadataStore) -> None:
    with pytest.raises(InvalidArgument):
        await store.compact(await store.revision() + 1000)


async def test_engines_refuse_what_etcd_refuses(faults: FaultInjector) -> None:
    """Below the store's own checks, both engines apply etcd's transaction rules."""
    engine = faults.inner
    with pytest.raises(TooManyOperations):
        await engine.txn([], [PutOp(f"/k{i}".encode(), b"") for i in range(129)])
    with pytest.raises(TooLarge):
        await engine.txn([], [PutOp(b"/big", b"x" * (2 * 1024 * 1024))])
    with pytest.raises(InvalidArgument):
        await engine.txn([], [PutOp(b"/dup", b"1"), PutOp(b"/dup", b"2")])
    with pytest.raises(InvalidArgument):
        await engine.txn([], [PutOp(b"/pd", b"1"), DeleteOp(b"/pd")])
    with pytest.raises(SessionExpired):
        await engine.txn([], [PutOp(b"/eph", b"1", lease=123456789)])
    await engine.txn([], [PutOp(b"/fine", b"1")])


async def test_a_slow_keepalive_does_not_hide_expiry(
    store: MetadataStore, faults: FaultInjector
) -> None:
    loop = asyncio.get_running_loop()
    opened = loop.time()
    session = await store.open_session(ttl_s=1)
    faults.delay("lease_keepalive", 30, times=None)  # every refresh hangs
    await asyncio.wait_for(session.expired.wait(), 10)
    assert loop.time() - opened < session.ttl_s + 0.5
    faults.clear()
    await session.close()


async def test_leadership_survives_a_reconnect_after_compaction(make_store: MakeStore) -> None:
    leader_store, rival_store = make_store(), make_store()
    session = await leader_store.open_session(5)
    leadership = await LeaderElection(leader_store, "c", session, b"a").campaign()
    rival_session = await rival_store.open_session(5)
    rival = asyncio.create_task(LeaderElection(rival_store, "c", rival_session, b"b").campaign())
    for i in range(20):
        await leader_store.put("/noise", str(i).encode())
    await leader_store.compact(await leader_store.revision())
    injectors = [s.engine for s in (leader_store, rival_store)]
    for injector in injectors:
        assert isinstance(injector, FaultInjector)
        injector.drop_watches()
    for injector in injectors:
        assert isinstance(injector, FaultInjector)

        def reopened(i: FaultInjector = injector) -> bool:
            return i.open_watches >= 1

        await wait_until(reopened, what="watches re-established")
    assert not leadership.lost.is_set() and not rival.done()
    await leadership.resign()
    won = await asyncio.wait_for(rival, 10)
    assert won.token > leadership.token
    await won.resign()
    await session.close()
    await rival_session.close()
