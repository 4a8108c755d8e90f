"""Retiring sealed segments: what a scalable topic's history leaves behind is deleted.

Every split or merge seals segments for good. Without this, each one kept its ledgers, its
cursors, its de-duplication and transaction state and its home in the store, and its node
in the topic's record, forever: a topic that splits and merges for months grew without
bound (issue 22). A sealed segment homed here is *retired* once

1. retention lets all of it go (:meth:`~segtxn.ledger.sealed.SealedLedger.released`): every
   subscription acknowledged all of it and it was sealed ``retention_time_s`` ago (without
   subscriptions, by time alone, as retention treats any ledger without cursors);
2. its parents are retired (parents first: a subscription reads a child only after its
   parents, so one still in a parent may have no cursor on the child yet, and the child's
   existing cursors alone do not say it is consumed);
3. no transaction has an op record on it (writes, or acks in any of its subscriptions):
   nothing is left to materialize or to clean up there;
4. nothing is attached to it (no producer, consumer or reader), it is not being loaded,
   and it is still homed here.

Before it retires, each of its subscriptions is created on its children at their start (as
a split does), so one that finished the segment but has not reached the children yet
keeps them from retiring until it has read them.

The sweep holds each segment in ``service.moving`` while it works on it, so no client
attaches to it on this broker meanwhile (``serve`` checks before and after reading the
home), and a drain does not move it. Retiring takes three steps, each idempotent, so a
sweep finishes what a crash interrupted:

a. **RETIRED in the topic's record** (one compare-and-set, :meth:`Catalog.retire_segment`,
   conditional on the home record it read: no drain or take-over meanwhile). The segment is
   unloaded first if it was loaded (its cursors saved) and judged from the store. From
   then on consumers count it done, fan-outs skip it (but a topic delete, which deletes it
   too), and no broker loads it.
b. **Its data and state deleted**: its logs, cursors, ledger record, de-duplication state
   and transaction-buffer records. A broker that restarts with the logs of a RETIRED
   segment half deleted does not refuse it (the sweep finishes the delete). A log whose
   file is not its own (another cluster's, a wrong restore: ``LedgerMismatch``) stops its
   segment's delete before anything goes, and the sweep goes on with the other segments;
   it is said at ERROR once per file (every sweep meets it until an operator acts), then
   at DEBUG.
c. **Pruned from the record with its home** (one store step, :meth:`Catalog.prune_segment`)
   once none of its parents is left: the record stays as small as the live part of the DAG.

A sweep runs every ``retire_check_s`` seconds (0: never) over the segments homed here.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING
from urllib.parse import unquote

import msgspec

from segtxn.broker import dedup_snapshots, handoff
from segtxn.broker.txn.buffer_records import delete_records
from segtxn.ledger import LedgerMismatch
from segtxn.ledger.errors import report_once
from segtxn.ledger.sealed import SealedLedger, delete_sealed, read_sealed
from segtxn.metastore import MetadataStoreError
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import Domain, TopicName
from segtxn.topics import transactions as T
from segtxn.topics.catalog import HOMES, HOMES_BY_BROKER, Catalog, home_key
from segtxn.topics.model import ScalableTopic, SegmentState

if TYPE_CHECKING:
    from segtxn.broker.service import BrokerService

log = logging.getLogger(__name__)


async def retire_segments(service: BrokerService, now_ms: float | None = None) -> list[TopicName]:
    """One sweep over the segments homed here (see the module docstring); returns those
    pruned in it. ``now_ms``: the time to judge ages by (tests)."""
    now_ms = time.time() * 1000 if now_ms is None else now_ms
    listing = await service.store.index_range(HOMES_BY_BROKER, service.broker_id)
    segments = [TopicName.parse(unquote(e.key[len(HOMES) :])) for e in listing.entries]
    done: list[TopicName] = []
    for segment in segments:
        if segment.domain is not Domain.SEGMENT or segment.segment is None:
            continue
        if segment in service.moving or service.is_loading(segment):
            continue
        service.moving.add(segment)  # no client attaches here until this one is done
        try:
            if await _sweep_one(service, segment, now_ms):
                done.append(segment)
        except (ServerError, MetadataStoreError) as e:  # a child's broker, the store
            log.warning("%s: not retired this time: %s", segment, e)
        except LedgerMismatch as e:  # its files are another's: never deleted, the rest go on
            report_once(log, e, "%s: its data is not deleted: %s", segment, e)
        finally:
            service.moving.discard(segment)
    return done


async def _sweep_one(service: BrokerService, segment: TopicName, now_ms: float) -> bool:
    """Retire, delete and prune ``segment`` as far as the rules allow now (``moving``
    held); True once it is pruned."""
    record = await service.catalog.get(segment.parent())
    info = record.segment(segment.segment or 0) if isinstance(record, ScalableTopic) else None
    if record is None or info is None:
        return False  # its topic is being created or deleted: not ours to judge
    home = await service.store.get(home_key(segment))
    if home is None or msgspec.json.decode(home.value) != service.broker_id:
        return False  # moved (a drain, a take-over) since the listing
    if info.state is SegmentState.SEALED:
        if not await _retire(service, segment, info.children, home.version, now_ms):
            return False
    elif info.state is not SegmentState.RETIRED:
        return False
    await delete_state(service, segment)
    if not await service.catalog.prune_segment(segment):
        return False  # a parent is left: pruned by a later sweep
    log.info("%s: removed from %s's DAG", segment, segment.parent())
    return True


async def is_retired(catalog: Catalog, segment: TopicName) -> bool:
    """Whether ``segment`` is RETIRED in its topic's record."""
    record = await catalog.get(segment.parent())
    info = record.segment(segment.segment or 0) if isinstance(record, ScalableTopic) else None
    return info is not None and info.state is SegmentState.RETIRED


async def check_not_retired(catalog: Catalog, segment: TopicName) -> None:
    """Raise TopicNotFound unless ``segment`` is in its topic's record and not RETIRED, or
    is a child of the split or merge in progress: a retired or pruned segment's data is
    gone or going, and loading it would make it again, empty and unsealed. A child of a
    topic being deleted is refused too: its deletion may have deleted it already, and a
    split still preparing it would otherwise create it again after that, left on disk."""
    record = await catalog.get(segment.parent())
    number = segment.segment or 0
    if not isinstance(record, ScalableTopic):
        raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"{segment}: its topic does not exist")
    info = record.segment(number)
    if info is None and number in record.creating() and record.deleting:
        raise ServerError(
            ErrorName.TOPIC_NOT_FOUND,
            f"{segment} will not exist: its topic is being deleted, and the split or merge "
            "creating it stops",
        )
    if info is None and number not in record.creating():
        raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"{segment} does not exist (retired)")
    if info is not None and info.state is SegmentState.RETIRED:
        raise ServerError(
            ErrorName.TOPIC_NOT_FOUND,
            f"{segment} was retired: every subscription consumed it and retention deleted it",
        )


async def _retire(
    service: BrokerService,
    segment: TopicName,
    children: list[int],
    home_version: int,
    now_ms: float,
) -> bool:
    """Step a, when the rules allow (``moving`` held); True if the segment is RETIRED now.

    Before it retires, every subscription of the segment is created on its children at
    their start (as a split does), so one that has not reached them yet keeps them from
    retiring until it has read them: retiring is judged on the cursors that exist."""
    loaded = service.topics.get(segment)
    if loaded is not None:
        if not loaded.idle():
            return False
        del service.topics[segment]
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
    if ledger.cursors:
        ops = service.controllers.segment_ops()
        topic = segment.parent()
        for child in children:
            await ops.prepare(topic.segment_name(child), sorted(ledger.cursors))
    if not await service.catalog.retire_segment(segment, home_version=home_version):
        return False
    service.metrics.segments_retired.add(1)
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


async def delete_state(service: BrokerService, segment: TopicName) -> None:
    """Step b: the segment's data and every record of its own (idempotent; also what
    deleting its topic does to a RETIRED segment)."""
    service.refused.pop(segment, None)  # a delete a crash cut short left files missing
    name = str(segment)
    ledger = await read_sealed(
        service.store, name, max_persisted_ranges=service.settings.ledger.max_persisted_ranges
    )
    if ledger is not None:
        await delete_sealed(service.store, service.storage, ledger)
    await delete_records(service.store, name)
    await dedup_snapshots.delete_state(service.store, name)
