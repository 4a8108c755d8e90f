"""A persistent topic's deletion mark: a deletion that stops part-way never leaves a topic
that loads again afresh, empty.

A persistent topic's deletion (:func:`delete_loaded`) deletes in turn its
subscriptions' v4 pending-ack logs, its ledger (logs, cursors, metadata record), its
de-duplication state and its transaction snapshots, then its record in the catalog. Each
step can fail (the store away, a full disk). Had one failed after the ledger's metadata
record went, the topic's next client (its own, hung up on, reconnecting at once) loaded it
again, its record still there, with a new ledger, empty: it was served, and what producers
stored in it was deleted by the retried deletion. Had one failed part-way through the
ledger, the next load was refused for its missing files, and so was the retried deletion,
which loaded the topic to delete it.

So before it deletes anything, the deletion marks the topic's record ``deleting`` (one
compare-and-set; nothing unmarks it: the mark commits to the deletion, as a scalable
topic's does). A marked topic is not loaded (:func:`check_not_marked`: ``ServiceNotReady``,
which clients retry until the deletion finishes, then meet ``TopicNotFound``), and the
next ``DELETE`` of it finishes it from what the store and the disk hold, without loading it
(:func:`finish`; each step is idempotent, so a retry stopped part-way again is finished by
the one after it).

A segment needs no mark of its own: it is deleted only once its scalable topic's record is
marked ``deleting`` (:mod:`segtxn.broker.segment_ends`), and that mark stays until every
segment is deleted. So a segment of a marked topic is not loaded either, and one not loaded
here is deleted without loading it (:func:`finish_segment`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING
from urllib.parse import unquote

import msgspec

from segtxn.broker import dedup_snapshots, handoff
from segtxn.broker.txn.buffer_records import delete_records
from segtxn.broker.txn.pending_ack_log import delete_log, pending_ack_log
from segtxn.ledger import LedgerError, delete_unopened
from segtxn.ledger.cursor import cursors_prefix
from segtxn.metastore import BadVersion, Delete, MetadataStoreError, NotFound, Record
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import Domain, TopicName
from segtxn.topics.catalog import Catalog, home_key, topic_key
from segtxn.topics.model import PersistentTopic, ScalableTopic, encode_topic, read_topic

if TYPE_CHECKING:
    from segtxn.broker.service import BrokerService
    from segtxn.broker.topic import Topic

log = logging.getLogger(__name__)


async def mark(catalog: Catalog, name: TopicName) -> None:
    """Mark persistent topic ``name``'s record ``deleting`` (nothing to do if it is marked
    already, or has no record; nothing for a segment, whose topic's deletion marked it)."""
    if name.domain is not Domain.PERSISTENT:
        return
    while True:
        found = await catalog.store.get(topic_key(name))
        record = None if found is None else read_topic(found.key, found.value)
        if found is None or not isinstance(record, PersistentTopic) or record.deleting:
            return
        marked = msgspec.structs.replace(record, deleting=True)
        try:
            await catalog.store.put(
                topic_key(name), encode_topic(marked), expected_version=found.version
            )
        except (BadVersion, NotFound):
            continue  # changed meanwhile (a property): look again
        return


async def marked(catalog: Catalog, name: TopicName) -> Record | None:
    """Persistent topic ``name``'s record if it is marked ``deleting`` (None: it is not, or
    ``name`` is not a persistent topic)."""
    if name.domain is not Domain.PERSISTENT:
        return None
    found = await catalog.store.get(topic_key(name))
    if found is None:
        return None
    record = read_topic(found.key, found.value)
    return found if isinstance(record, PersistentTopic) and record.deleting else None


async def check_not_marked(catalog: Catalog, name: TopicName) -> None:
    """Called before ``name`` is loaded: a persistent topic marked ``deleting``, or a
    segment of a scalable topic marked so, is not.

    Raises:
        ServerError: ServiceNotReady, it is marked (retriable: the deletion is finished by
            the next ``DELETE``, after which it does not exist).
    """
    if name.domain is Domain.SEGMENT:
        topic = await catalog.get(name.parent())
        deleting = isinstance(topic, ScalableTopic) and topic.deleting
    else:
        deleting = await marked(catalog, name) is not None
    if deleting:
        deleted = name.parent() if name.domain is Domain.SEGMENT else name
        raise ServerError(
            ErrorName.SERVICE_NOT_READY,
            f"{name} is being deleted, and is not served again (a deletion of {deleted} "
            "that stopped part-way is finished by the next one)",
        )


async def delete_loaded(service: BrokerService, name: TopicName, topic: Topic) -> None:
    """Delete a loaded topic's or segment's data here (its clients are hung up on),
    and a persistent topic's record.

    Every file it would delete is checked first (its ledger's and its v4 pending-ack
    logs': :meth:`Topic.check_deletable`): a deletion refused by one that is not its own
    (``LedgerMismatch``, a foreign volume) leaves the topic served, its clients
    connected and its subscriptions' state whole, rather than cut them off and delete
    part of it for a deletion that cannot finish.

    A persistent topic's record in the catalog is deleted too, last, and is marked
    ``deleting`` before anything is (:func:`mark`): a deletion that
    stops part-way leaves the topic refused, never loaded afresh and empty, until the
    next ``DELETE`` finishes it. Until its record is gone the topic is guarded as during
    an unload (``service.unloads``): its clients, hung up on, reconnect at once and are
    told to retry; a load meanwhile would be refused by its ledger file's lock, or,
    once the ledger is deleted, serve it afresh and empty.

    The check yields: a topic unloaded meanwhile (an idle unload, a drain, a failed
    write) is not deleted, since the instance checked is closed and another may be
    loaded in its place by then (deleting its files under it, or taking it out of the
    broker's topics, would leave it open and unreachable): the caller is told to retry.

    Raises:
        ServerError: ServiceNotReady, the topic was unloaded during the check (nothing
            was deleted), or the deletion stopped part-way (a store or ledger error:
            :meth:`~segtxn.broker.topic.Topic.delete`; the topic is let go, and a retry
            finishes it).
        LedgerMismatch, MetadataStoreError: from the check; nothing was changed.
    """
    await topic.check_deletable()
    await mark(service.catalog, name)  # from now on it does not load afresh
    if service.topics.get(name) is not topic:  # let go (or loaded again) while checked
        raise ServerError(
            ErrorName.SERVICE_NOT_READY,
            f"{name} was unloaded from broker {service.broker_id} while its deletion "
            "checked it; nothing was deleted: retry the deletion",
        )
    service.unloads.begin(name)  # in the same step as it leaves the broker's topics
    try:
        service.topics.pop(name, None)
        await topic.disconnect_clients()
        try:
            await topic.delete()
        except (LedgerError, MetadataStoreError) as e:
            log.warning("deleting %s on broker %s stopped part-way: %s", name, service.broker_id, e)
            raise ServerError(
                ErrorName.SERVICE_NOT_READY,
                f"{name}: its deletion stopped part-way ({type(e).__name__}: {e}); it is "
                "let go: retry the deletion to finish it",
            ) from e
        log.info("deleted %s's data on broker %s", name, service.broker_id)
        if name.domain is Domain.PERSISTENT:  # (a segment's record is its topic's)
            record = await service.catalog.get(name)
            if record is not None:
                await service.catalog.delete(name, record)
    finally:
        service.unloads.end(name)


async def finish(service: BrokerService, name: TopicName, found: Record) -> None:
    """Finish the deletion of persistent topic ``name``, marked (``found`` is its record),
    not loaded here (nothing loads it: :func:`check_not_marked`): its subscriptions' v4
    pending-ack logs, its ledger (its files as far as they are left), its de-duplication
    state, its transaction snapshots (a failure there is logged: a topic created again
    under the name never loads them), then its record and home, by compare-and-set, if the
    record is still the one ``found`` read (a topic created again under the name, after
    another deletion finished this one, is left alone).

    Raises:
        ServerError: ServiceNotReady, it is being deleted here already (try again).
        LedgerMismatch: a file of it is not its own (a foreign volume): nothing of the
            ledger was deleted, and the topic stays marked.
        LedgerError, MetadataStoreError: a step failed; the next ``DELETE`` goes on.
    """
    async with _guarded(service, name):
        await _finish(service, name, found)


async def finish_segment(service: BrokerService, name: TopicName) -> None:
    """Delete segment ``name`` of a scalable topic being deleted, not loaded here (nothing
    loads it: :func:`check_not_marked`): its ledger as it is left (sealed or not, its files
    as far as they are left), its transaction buffer's records and its de-duplication
    state; its home goes with its topic's record.

    Raises:
        ServerError: ServiceNotReady, it is being deleted or loaded here now (try again).
        LedgerMismatch: a file of it is not its own; nothing of the ledger was deleted.
        LedgerError, MetadataStoreError: a step failed; the next ``DELETE`` goes on.
    """
    async with _guarded(service, name):
        service.refused.pop(name, None)  # (files missing after a delete cut short)
        await delete_unopened(str(name), service.store, service.storage)
        await delete_records(service.store, str(name))
        await dedup_snapshots.delete_state(service.store, str(name))
        service.load_refusals.forget(name)


@contextlib.asynccontextmanager
async def _guarded(service: BrokerService, name: TopicName) -> AsyncIterator[None]:
    """Hold ``name`` in the unload guard while its files are deleted, unloaded: a client
    is told to retry meanwhile, and a load in flight (begun before the mark) is waited for
    and let go as it ends (it would otherwise open the files being deleted).

    Raises:
        ServerError: ServiceNotReady, another deletion or unload of it runs here, or it was
            loaded here (before it was marked) while the caller looked: the next
            ``DELETE`` deletes that instance.
    """
    handoff.check_not_leaving(service, name)
    service.unloads.begin(name)
    try:
        loading = service.loading(name)
        if loading is not None:  # it lets itself go as it ends (handoff.check_not_unloaded)
            await asyncio.wait([loading])
        if name in service.topics:
            raise ServerError(
                ErrorName.SERVICE_NOT_READY,
                f"{name} was loaded on broker {service.broker_id} as its deletion began; "
                "retry the deletion",
            )
        yield
    finally:
        service.unloads.end(name)


async def _finish(service: BrokerService, name: TopicName, found: Record) -> None:
    store, ledger = service.store, str(name)
    listing = await store.list_prefix(cursors_prefix(ledger))
    for cursor in (unquote(r.key[len(cursors_prefix(ledger)) :]) for r in listing.records):
        await delete_log(pending_ack_log(ledger, cursor), store, service.storage)
    await delete_unopened(ledger, store, service.storage)
    await dedup_snapshots.delete_state(store, ledger)
    try:
        await service.snapshots.forget(name.tenant, name.namespace, ledger)
    except (LedgerError, MetadataStoreError) as e:
        log.warning("%s: its transaction snapshots were not tombstoned: %s", name, e)
    service.refused.pop(name, None)  # (files missing after a delete cut short)
    while True:
        now = await store.get(topic_key(name))
        if now is None or now.created_version != found.created_version:
            break  # finished by another deletion meanwhile
        deletes = [Delete(now.key, expected_version=now.version)]
        home = await store.get(home_key(name))
        if home is not None:
            deletes.append(Delete(home.key, expected_version=home.version))
        try:
            await store.commit(deletes)
        except (BadVersion, NotFound):
            continue  # the record or its home changed meanwhile: look again
        log.info("finished deleting %s on broker %s", name, service.broker_id)
        break
    service.load_refusals.forget(name)  # (its refusals while marked: gone with it)
