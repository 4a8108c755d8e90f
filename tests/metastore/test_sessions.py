"""Conformance: sessions, ephemeral records, expiry, and leader election hand-over."""

from __future__ import annotations

import asyncio
import logging

import pytest

from segtxn.metastore import (
    EventKind,
    LeaderElection,
    MetadataStore,
    SessionExpired,
    StoreAccessDenied,
    StoreClosed,
    StoreUnavailable,
)
from segtxn.metastore.election import ELECTIONS_PREFIX
from segtxn.metastore.faults import FaultInjector
from segtxn.metastore.memory import MemoryEngine
from tests.metastore.conftest import MakeStore
from tests.waiting import take, wait_until


async def test_closing_a_session_deletes_its_records(store: MetadataStore) -> None:
    session = await store.open_session(ttl_s=5)
    await store.put("/owner/topic-1", b"broker-1", session=session, indexes={"by-owner": "b1"})
    await store.put("/durable", b"stays")
    async with store.watch("/owner/topic-1") as events:
        await session.close()
        (event,) = await take(events, 1)
    assert event.kind is EventKind.DELETE
    assert (await store.index_range("by-owner")).entries == []
    assert await store.get("/durable") is not None
    with pytest.raises(SessionExpired):
        await store.put("/owner/topic-2", b"x", session=session)


async def test_lease_expires_when_keepalives_stop(
    store: MetadataStore, faults: FaultInjector
) -> None:
    session = await store.open_session(ttl_s=1)
    record = await store.put("/eph", b"x", session=session)
    assert record.session_id == session.lease_id
    faults.fail("lease_keepalive", times=None)  # the holder is cut off from the store
    await asyncio.wait_for(session.expired.wait(), 10)
    await wait_until(lambda: _absent(store, "/eph"), timeout=10, what="ephemeral key deleted")
    faults.clear()
    await session.close()


async def _absent(store: MetadataStore, key: str) -> bool:
    return await store.get(key) is None


async def test_store_side_expiry_is_noticed(store: MetadataStore, faults: FaultInjector) -> None:
    session = await store.open_session(ttl_s=1)
    await store.put("/eph2", b"x", session=session)
    assert await faults.expire_sessions() == 1
    await asyncio.wait_for(session.expired.wait(), 10)
    assert await store.get("/eph2") is None
    with pytest.raises(SessionExpired):
        await store.put("/eph3", b"x", session=session)


async def test_leader_election_hand_over(make_store: MakeStore) -> None:
    a_store, b_store = make_store(), make_store()
    a_session, b_session = await a_store.open_session(5), await b_store.open_session(5)
    first = await LeaderElection(a_store, "tc-0", a_session, b"a").campaign()
    standby = asyncio.create_task(LeaderElection(b_store, "tc-0", b_session, b"b").campaign())
    await asyncio.sleep(0)
    assert not standby.done()
    leader = await LeaderElection(b_store, "tc-0", b_session).leader()
    assert leader is not None and leader.value == b"a"

    await a_session.close()  # the leader dies
    second = await asyncio.wait_for(standby, 10)
    await asyncio.wait_for(first.lost.wait(), 10)
    assert second.token > first.token
    leader = await LeaderElection(a_store, "tc-0", b_session).leader()
    assert leader is not None and leader.value == b"b"
    await second.resign()
    assert second.lost.is_set()
    assert await LeaderElection(a_store, "tc-0", b_session).leader() is None
    await b_session.close()


async def test_leadership_is_lost_when_the_key_goes(store: MetadataStore) -> None:
    session = await store.open_session(5)
    leadership = await LeaderElection(store, "ctl", session).campaign()
    await store.delete(leadership.election.key)  # e.g. an operator forcing a re-election
    await asyncio.wait_for(leadership.lost.wait(), 10)
    await leadership.resign()
    await session.close()


async def test_campaign_fails_when_the_session_expires(make_store: MakeStore) -> None:
    holder, waiter = make_store(), make_store()
    held = await holder.open_session(5)
    leadership = await LeaderElection(holder, "x", held).campaign()
    waiting_session = await waiter.open_session(1)
    campaign = asyncio.create_task(LeaderElection(waiter, "x", waiting_session).campaign())
    injector = waiter.engine
    assert isinstance(injector, FaultInjector)
    await injector.expire_sessions()
    with pytest.raises(SessionExpired):
        await asyncio.wait_for(campaign, 10)
    await leadership.resign()
    await held.close()


async def test_a_campaign_whose_answer_was_lost_leads_on_the_retry(store: MetadataStore) -> None:
    """The election key's create lands but its answer is lost (the store restarting under
    it): the campaign fails, and a retry on the same session finds the key its own session
    holds and leads, instead of waiting for ever for that key to go (a coordinator id held
    by nobody, its timed-out transactions never aborted)."""
    session = await store.open_session(5)
    injector = store.engine
    assert isinstance(injector, FaultInjector)
    injector.fail("txn", key_prefix=ELECTIONS_PREFIX, after_apply=True)
    election = LeaderElection(store, "lost", session, b"me")
    with pytest.raises(StoreUnavailable):
        await election.campaign()
    leadership = await asyncio.wait_for(election.campaign(), 10)
    held = await election.leader()
    assert held is not None and held.value == b"me" and leadership.token == held.version
    other = await store.open_session(5)
    rival = asyncio.create_task(LeaderElection(store, "lost", other, b"rival").campaign())
    await leadership.resign()  # the rival's wait is for this key, not for ever
    assert (await asyncio.wait_for(rival, 10)).token > leadership.token
    await session.close()
    await other.close()


async def test_a_resign_whose_delete_fails_raises_and_leaves_the_leadership_guarded(
    store: MetadataStore, faults: FaultInjector
) -> None:
    """A resign whose delete of the election key fails raises that error, and the
    leadership is still held and guarded: ``lost`` is set when it does end (the session
    closed here), and a second resign gives it up. (The guard was cancelled before the
    delete: ``lost`` was then never set, whatever became of the key.)"""
    session = await store.open_session(5)
    leadership = await LeaderElection(store, "resign-fails", session, b"me").campaign()
    faults.fail("txn", key_prefix=ELECTIONS_PREFIX)
    with pytest.raises(StoreUnavailable):
        await leadership.resign()
    assert faults.injected == 1
    assert not leadership.lost.is_set()
    assert (await leadership.election.leader()) is not None  # still held, still ours
    await leadership.resign()  # tried again: given up now
    assert leadership.lost.is_set()
    assert await leadership.election.leader() is None

    other = await store.open_session(5)
    guarded = await LeaderElection(store, "resign-fails", other).campaign()
    faults.fail("txn", key_prefix=ELECTIONS_PREFIX)
    with pytest.raises(StoreUnavailable):
        await guarded.resign()
    await other.close()  # the leadership ends another way: that is seen
    await asyncio.wait_for(guarded.lost.wait(), 5)
    await session.close()


async def test_closing_the_store_closes_its_engine_whatever_closing_a_session_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A session whose lease revocation is refused (not just unanswered) does not keep the
    store from closing its other sessions and its engine; the failures are logged once, at
    WARNING. (Only StoreUnavailable was caught: the refusal was raised out of close(), the
    later sessions' keep-alives ran on, and the engine was never closed.)"""
    engine = MemoryEngine()
    faults = FaultInjector(engine)
    store = MetadataStore(faults, owns_engine=True)
    sessions = [await store.open_session(5), await store.open_session(5)]
    faults.fail("lease_revoke", times=None, error=StoreAccessDenied("injected: refused"))
    with caplog.at_level(logging.WARNING, logger="segtxn.metastore.store"):
        await store.close()
    assert faults.injected == 2  # both revocations were tried
    assert all(s.expired.is_set() for s in sessions)
    with pytest.raises(StoreClosed):
        await engine.range(b"/any")
    (warning,) = [r for r in caplog.records if r.name == "segtxn.metastore.store"]
    assert warning.levelno == logging.WARNING and "StoreAccessDenied" in warning.getMessage()
