"""A change of a ledger's metadata record that meets another owner's fence stops the ledger,
whichever change it was; and a ledger stops with another it is tied to
(``stop_with``) when that one stops for a reason reopening may cure.

Every change of the record (a rollover, a trim, a property's change, a seal) is a CAS on the
version this owner last wrote (segtxn/ledger/appends.py). One that failed on another
owner's change raised ``LedgerFenced`` to its caller and nothing more: a compacted log whose
compaction met it logged "compaction failed, retried later", and went on taking appends on
a ledger another process owned, until a write met the fence in its turn. A cursor's save
that proved the same fence stopped the ledger (``fenced``); now every proof does.

A topic's compacted logs (a subscription's pending-ack log) are ledgers of their own: a
fence one of them met stopped it alone, and nobody watched it. ``stop_with`` passes a
retriable stop on to the ledger its owner watches (the topic's), once; damage is not
passed on, as a topic's own damage does not unload it.
"""

from __future__ import annotations

import pytest

from segtxn.ledger import ManagedLedger
from segtxn.ledger.errors import LedgerFenced, WriteFailed
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStore
from tests.ledger.conftest import OpenLedger


async def take_over(store: MetadataStore, ledger: ManagedLedger) -> None:
    """Another owner's change of ``ledger``'s metadata record (an open elsewhere)."""
    key = metadata_key(ledger.name)
    record = await store.get(key)
    assert record is not None
    await store.put(key, record.value, expected_version=record.version)


def watched(ledger: ManagedLedger) -> list[WriteFailed]:
    told: list[WriteFailed] = []
    ledger.watch_write_failure(told.append)
    return told


async def tied(open_ledger: OpenLedger) -> tuple[ManagedLedger, ManagedLedger, list[WriteFailed]]:
    """A topic's ledger tied to its subscription's pending-ack log (``stop_with``), and
    what the topic's ledger tells its watcher."""
    topic = await open_ledger("persistent://t/n/topic")
    log_ = await open_ledger("persistent://t/n/topic-s__transaction_pending_ack")
    topic.stop_with(log_)
    return topic, log_, watched(topic)


async def test_a_rollover_that_meets_another_owner_stops_the_ledger(
    open_ledger: OpenLedger, store: MetadataStore
) -> None:
    """(A compacted log's compaction starts with one.)"""
    ledger = await open_ledger()
    told = watched(ledger)
    await ledger.append(b"a")
    await take_over(store, ledger)
    with pytest.raises(LedgerFenced):
        await ledger.roll_over()
    assert [t.retriable for t in told] == [True]
    with pytest.raises(WriteFailed) as refused:
        await ledger.append(b"refused")  # (a file ledger's append checks no record)
    assert refused.value.retriable


async def test_a_property_change_that_meets_another_owner_stops_the_ledger(
    open_ledger: OpenLedger, store: MetadataStore
) -> None:
    ledger = await open_ledger()
    told = watched(ledger)
    await take_over(store, ledger)
    with pytest.raises(LedgerFenced):
        await ledger.update_properties({"k": "v"})
    with pytest.raises(LedgerFenced):
        await ledger.update_properties({"k": "v"})  # fenced again: told once
    assert [t.retriable for t in told] == [True]
    with pytest.raises(WriteFailed):
        await ledger.append(b"refused")


async def test_a_retriable_stop_of_a_tied_ledger_stops_this_one_once(
    open_ledger: OpenLedger, store: MetadataStore
) -> None:
    topic, log_, told = await tied(open_ledger)
    await log_.append(b"ack")
    await take_over(store, log_)
    with pytest.raises(LedgerFenced):
        await log_.roll_over()
    with pytest.raises(LedgerFenced):
        await log_.update_properties({"k": "v"})  # fenced again
    assert len(told) == 1 and told[0].retriable, told
    assert isinstance(told[0].cause, LedgerFenced)  # the log's own cause, passed on
    with pytest.raises(WriteFailed) as refused:
        await topic.append(b"refused")
    assert refused.value.retriable


async def test_damage_of_a_tied_ledger_is_not_passed_on(open_ledger: OpenLedger) -> None:
    """A write of the log that failed for good (not retriable): the log refuses appends,
    and the topic's ledger goes on (as the topic's own damage does not unload it)."""
    topic, log_, told = await tied(open_ledger)
    current = log_._current
    assert current is not None

    def damaged(payloads: object) -> None:
        raise OSError(5, "Input/output error")

    current.append_batch = damaged  # type: ignore[method-assign]
    with pytest.raises(WriteFailed) as failed:
        await log_.append(b"lost")
    assert not failed.value.retriable
    assert told == []
    await topic.append(b"goes on")


async def test_a_tied_ledger_stopped_before_it_is_tied_stops_this_one_at_once(
    open_ledger: OpenLedger, store: MetadataStore
) -> None:
    """(``watch_write_failure`` tells a stop that came first.)"""
    topic = await open_ledger("persistent://t/n/topic")
    log_ = await open_ledger("persistent://t/n/topic-s__transaction_pending_ack")
    told = watched(topic)
    await take_over(store, log_)
    with pytest.raises(LedgerFenced):
        await log_.update_properties({"k": "v"})
    topic.stop_with(log_)
    assert len(told) == 1 and told[0].retriable, told


async def test_a_stop_of_a_tied_ledger_after_this_one_is_closed_is_not_passed_on(
    open_ledger: OpenLedger, store: MetadataStore
) -> None:
    """(A topic's close closes its ledger, then its subscriptions' logs: a fence one of
    them meets meanwhile is no news to a ledger let go already.)"""
    topic, log_, told = await tied(open_ledger)
    assert await topic.close() is True  # its clean close recorded
    await take_over(store, log_)
    with pytest.raises(LedgerFenced):
        await log_.update_properties({"k": "v"})
    assert told == []
