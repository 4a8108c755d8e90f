"""Retiring sealed segments: what a scalable topic's history leaves behind is deleted.

Every split or merge seals segments for good. Without this, each one kept its ledgers, its
cursors, its de-duplication and transaction state and its home in the store, and its node
in the topic's record, forever: a topic that splits and merges for months grew without
bound (issue 22). A sealed segment homed here is *retired* once

1. retention lets all of it go (:meth:`~segtxn.ledger.sealed.SealedLedger.released`): every
   subscription acknowledged all of it and it was sealed ``retention_time_s`` ago (without
   subscriptions, by time alone, as retention treats any ledger without cursors);
2. no transaction has an op record on it (writes, or acks in any of its subscriptions):
   nothing is left to materialize or to clean up there;
3. nothing is attached to it (no producer, consumer or reader) and it is not being loaded.

Retiring takes three steps, each idempotent, so a sweep finishes what a crash interrupted:

a. **RETIRED in the topic's record** (one compare-and-set, :meth:`Catalog.retire_segment`).
   Consumers count a RETIRED segment done, fan-outs skip it, and this broker refuses to load
   it. The segment is held in ``service.moving`` from its last check until this step, so
   no client can attach on this broker in between; it is unloaded first if it was loaded
   (its cursors saved), and judged again from the store.
b. **Its data and state deleted**: its logs, cursors, ledger record, de-duplication state
   and transaction-buffer records.
c. **Pruned from the record with its home** (one store step, :meth:`Catalog.prune_segment`)
   once none of its parents is left: the record stays as small as the live part of the DAG.

A sweep runs every ``retire_check_s`` seconds (0: never) over the segments homed here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from segtxn.broker import handoff
from segtxn.broker.dedup import PREFIX as DEDUP_PREFIX
from segtxn.broker.txn.buffer_records import ABORTED, ORPHANS, STATE
from segtxn.ledger.sealed import SealedLedger, delete_sealed, read_sealed
from segtxn.metastore import NotFound
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import Domain, TopicName
from segtxn.topics import transactions as T
from segtxn.topics.catalog import HOMES, HOMES_BY_BROKER, Catalog
from segtxn.topics.model import ScalableTopic, SegmentState

if TYPE_CHECKING:
    from segtxn.broker.service import BrokerService

log = logging.getLogger(__name__)


async def retire_segments(service: BrokerService, now_ms: float | None = None) -> list[TopicName]:
    """One sweep over the segments homed here (see the module docstring); returns those
    retired or pruned in it. ``now_ms``: the time to judge ages by (tests)."""
    now_ms = time.time() * 1000 if now_ms is None else now_ms
    listing = await service.store.index_range(HOMES_BY_BROKER, service.broker_id)
    segments = [TopicName.parse(unquote(e.key[len(HOMES) :])) for e in listing.entries]
    records: dict[TopicName, ScalableTopic | None] = {}
    done: list[TopicName] = []
    for segment in segments:
        if segment.domain is not Domain.SEGMENT or segment.segment is None:
            continue
        topic = segment.parent()
        if topic not in records:
            record = await service.catalog.get(topic)
            records[topic] = record if isinstance(record, ScalableTopic) else None
        record = records[topic]
        info = None if record is None else record.segment(segment.segment)
        if info is None:
            continue  # its topic is being created or deleted: not ours to judge
        if info.state is SegmentState.SEALED:
            if not await _retire(service, segment, now_ms):
                continue
        elif info.state is not SegmentState.RETIRED:
            continue
        await _delete_state(service, segment)
        if await service.catalog.prune_segment(segment):
            log.info("%s: retired and removed from %s's DAG", segment, topic)
            service.metrics.segments_retired.add(1)
        done.append(segment)
        records.pop(topic)  # changed: read again for its next segment
    return done


async def check_not_retired(catalog: Catalog, segment: TopicName) -> None:
    """Raise TopicNotFound for a RETIRED segment: its data is gone or going, and loading it
    would make it again, empty."""
    record = await catalog.get(segment.parent())
    info = record.segment(segment.segment or 0) if isinstance(record, ScalableTopic) else None
    if info is not None and info.state is SegmentState.RETIRED:
        raise ServerError(
            ErrorName.TOPIC_NOT_FOUND,
            f"{segment} was retired: every subscription consumed it and retention deleted it",
        )


async def _retire(service: BrokerService, segment: TopicName, now_ms: float) -> bool:
    """Step a, when the rules allow; True if the segment is RETIRED now."""
    loaded = service.topics.get(segment)
    if loaded is not None and not loaded.idle():
        return False
    if segment in service.moving or service.is_loading(segment):
        return False
    service.moving.add(segment)
    try:
        loaded = service.topics.pop(segment, None)
        if loaded is not None:
            await handoff.let_go(loaded)  # its cursors saved: the store says all
        ledger = await read_sealed(
            service.store,
            str(segment),
            max_persisted_ranges=service.settings.ledger.max_persisted_ranges,
        )
        if ledger is None or not ledger.released(service.settings.retention, now_ms):
            return False
        if await _has_transactions(service, segment, ledger):
            return False
        if not await service.catalog.retire_segment(segment):
            return False
    finally:
        service.moving.discard(segment)
    log.info("%s: consumed and past retention: retiring it", segment)
    return True


async def _has_transactions(
    service: BrokerService, segment: TopicName, ledger: SealedLedger
) -> bool:
    """Whether an op record of any transaction names the segment or one of its
    subscriptions (the store's indexes: one range read each)."""
    name = str(segment)
    if (await service.store.index_range(T.IDX_WRITES, name, limit=1)).entries:
        return True
    for subscription in ledger.cursors:
        if (await service.store.index_range(T.IDX_ACKS, (name, subscription), limit=1)).entries:
            return True
    return False


async def _delete_state(service: BrokerService, segment: TopicName) -> None:
    """Step b: the segment's data and every record of its own (idempotent)."""
    name = str(segment)
    ledger = await read_sealed(
        service.store, name, max_persisted_ranges=service.settings.ledger.max_persisted_ranges
    )
    if ledger is not None:
        await delete_sealed(service.store, service.storage, ledger)
    quoted = quote(name, safe="")
    for prefix in (f"{ABORTED}{quoted}/", f"{ORPHANS}{quoted}/"):
        await service.store.delete_range(prefix)
    dedup = DEDUP_PREFIX + quoted
    await service.store.delete_range(dedup, dedup + "\x01")  # as Deduplication.delete
    with contextlib.suppress(NotFound):
        await service.store.delete(STATE + quoted)
