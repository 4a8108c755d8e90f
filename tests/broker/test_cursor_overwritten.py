"""An acknowledgment whose cursor save is refused because the cursor's own record was
written by someone else (a hand edit, a repair from the store alone) is answered by name,
never as a bug.

A save is a compare-and-set on the version of the cursor's record its broker last wrote
(segtxn/ledger/cursor.py). Written by someone else meanwhile, every later save of the
loaded cursor is refused (``LedgerFenced``), and its consumers' acks reached them as
``UnknownError`` with an incident, for ever. What the answer should be depends on the
record now, as for a v4 transaction's end (segtxn/broker/v4ends.py):

- **it does not read** (damaged by hand): ``PersistenceError`` naming the record and its
  repair (``CursorDamaged``), logged once; the topic stays served (its producers and other
  subscriptions go on), and the repair through the broker unloads it first (docs/ledger.md,
  "Repairing a damaged cursor");
- **it reads, or is gone** (repaired from the store alone, or written by hand): the
  broker's state of the cursor is stale, and only a load reads the record. The ack is
  ``ServiceNotReady`` (retriable), and the topic is unloaded, once, as after a save fenced
  by another owner: its consumers come back through lookup to the cursor loaded again from
  the record as it is now.

Real components: a broker (aiohttp, file ledgers, the memory store and a real etcd) and the
client; the record is written in the store as an operator's tools write it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from segtxn.client import Consumer, Message
from segtxn.ledger import Position
from segtxn.ledger.cursor import cursor_key
from segtxn.ledger.cursor_repair import repair_cursor
from segtxn.ledger.errors import LedgerError
from segtxn.metastore import MetadataStore
from segtxn.protocol.errors import ErrorCategory, ErrorName, ServerError
from tests.broker.test_fenced_cursor_unload import (
    NAME,
    TOPIC,
    delivered,
    record_let_go,
    record_refusals,
    serving,
)
from tests.waiting import wait_until

KEY = cursor_key(TOPIC, "s")


async def damage(store: MetadataStore) -> None:
    """The cursor's record written by hand with what does not read."""
    record = await store.get(KEY)
    assert record is not None
    await store.put(KEY, b"{not a cursor", expected_version=record.version)


async def acknowledged(consumer: Consumer, messages: list[Message]) -> list[BaseException | None]:
    return await asyncio.gather(
        *(consumer.acknowledge(m, timeout_s=10) for m in messages), return_exceptions=True
    )


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


async def test_an_ack_whose_cursor_record_was_repaired_elsewhere_reloads_the_topic_once(
    store: MetadataStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Damaged by hand, then repaired from the store alone (not through the broker, whose
    endpoint unloads the topic first): the loaded cursor's next save meets a record that
    reads, at a version it never wrote."""
    async with serving(store, tmp_path) as (broker, client):
        consumer, messages = await delivered(client, 3)
        await consumer.acknowledge(messages[0], timeout_s=10)  # saved
        topic = broker.service.topics[NAME]
        (stream,) = consumer._streams.values()
        refusals = record_refusals(monkeypatch)
        let_go = record_let_go(monkeypatch)
        await damage(store)
        repaired = await repair_cursor(store, TOPIC, "s")  # to the first retained entry
        with caplog.at_level(logging.WARNING):
            outcomes = await acknowledged(consumer, messages[1:])
            await wait_until(
                lambda: broker.service.topics.get(NAME) is not topic,
                what="the topic unloaded",
            )
            await wait_until(lambda: stream.reconnects >= 1, what="the consumer sent on")
            await wait_until(lambda: not broker.service.dropping, what="the unload done")
        # the save was refused as retriable (the client sent the ack again, or raised
        # ServiceNotReady), the topic let go of once, and nothing taken for a bug
        overwritten = [r for r in refusals if isinstance(r, LedgerError)]
        assert overwritten, refusals
        assert all(r.retriable for r in overwritten), overwritten
        assert "written by someone else" in str(overwritten[0]), overwritten
        for outcome in outcomes:
            if outcome is not None:
                assert isinstance(outcome, ServerError), repr(outcome)
                assert outcome.name is ErrorName.SERVICE_NOT_READY, outcome
        assert [t for t in let_go if t is topic] == [topic], let_go
        assert not [s for s in said(caplog) if "incident" in s], said(caplog)
        # loaded again, the cursor is the repaired record's (every retained entry): the
        # message acknowledged before the repair comes again (and so do the others, but
        # for the acks the client sent again once attached)
        assert repaired.next_position.entry_id == 0
        first = await consumer.receive(timeout_s=10)
        assert first.value == messages[0].value, first
        await consumer.acknowledge(first, timeout_s=10)
        for message, outcome in zip(messages[1:], outcomes, strict=True):
            if outcome is not None:  # (raised to the application: it acknowledges again)
                await consumer.acknowledge(message, timeout_s=10)
        reloaded = broker.service.topics[NAME].ledger.cursors["s"]
        last = messages[-1].message_id
        await wait_until(
            lambda: reloaded.persisted_mark_delete == Position(last.ledger_id, last.entry_id),
            what="every ack saved in the reloaded cursor",
        )
        await consumer.close()


async def test_an_ack_whose_cursor_record_was_damaged_is_a_persistence_error_naming_the_repair(
    store: MetadataStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(store, tmp_path) as (broker, client):
        consumer, messages = await delivered(client, 2)
        topic = broker.service.topics[NAME]
        (stream,) = consumer._streams.values()
        let_go = record_let_go(monkeypatch)
        await damage(store)
        with caplog.at_level(logging.WARNING):
            for message in messages:  # every save meets it: said by name each time
                with pytest.raises(ServerError) as refused:
                    await consumer.acknowledge(message, timeout_s=10)
                assert refused.value.name is ErrorName.PERSISTENCE, refused.value
                assert refused.value.category is ErrorCategory.FATAL, refused.value
                assert KEY in refused.value.message, refused.value.message
                assert "repair-cursor" in refused.value.message, refused.value.message
        assert not [s for s in said(caplog) if "incident" in s], said(caplog)
        logged = [r for r in caplog.records if r.levelno == logging.ERROR and KEY in r.getMessage()]
        assert len(logged) <= 1, logged  # once a process, not once per ack
        # the topic stays served (its producers go on), its consumer attached
        assert broker.service.topics.get(NAME) is topic and not let_go, let_go
        assert stream.reconnects == 0
        producer = await client.create_producer(TOPIC)
        await producer.send(b"after the damage")
        await producer.close()
        # the operator's repair, through the broker, unloads it first; then the consumer,
        # sent on, is given every retained message again and acknowledges them
        await client.admin.repair_cursor(TOPIC, "s")
        assert [t for t in let_go if t is topic] == [topic], let_go
        await wait_until(lambda: stream.reconnects >= 1, what="the consumer sent on")
        again = [await consumer.receive(timeout_s=10) for _ in range(3)]
        assert [m.value for m in again] == [*(m.value for m in messages), b"after the damage"]
        for message in again:
            await consumer.acknowledge(message, timeout_s=10)
        await consumer.close()
