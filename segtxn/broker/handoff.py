"""Handing topics off: draining a broker, and letting go of topics that live elsewhere now.

**Draining** hands every topic and segment a broker holds to the others, for a rolling
restart or a scale-down, with a pause of a reconnect instead of an outage.

Only with replication (its ledgers are on other brokers too). ``POST
/admin/v2/brokers/{id}/drain`` (answered by that broker) first registers it as draining, so
nothing new is placed on it (nor taken over by it), then moves its homes one by one to the
live broker with the fewest:

1. the topic is marked moving (a client that connects meanwhile is told to retry:
   ``ServiceNotReady``), unloaded if loaded — its clients are hung up on, and its ledger
   closed cleanly (the count recorded), so the new home opens it without a recovery;
2. its home record moves, with one compare-and-set (:meth:`Catalog.move_home`);
3. clients find the new home by lookup and go on there (producers resend what was not
   acknowledged; de-duplication keeps it once).

A topic that fails to move stays here, served, and is named in the answer; draining again
retries it. The broker keeps serving its replicas (other brokers' ledgers). It stays
draining until ``DELETE .../drain`` or a restart (the flag lives in its registration).

**Letting go.** A topic whose ledger stopped taking appends for a reason reopening may
cure (too few replicas, the store away, a fence met by an append or by a cursor's save:
:meth:`~segtxn.ledger.appends.LedgerAppends.fenced`) is unloaded, its clients hung up on, so
the next one reopens it here or is sent where it lives now (:func:`write_failed`); a
broker that lost its registration lets go of what is no longer provably its own
(:mod:`segtxn.broker.fencing`); and sealed topics left idle are unloaded
(:func:`unload_idle`), loaded again on their next use.

**An unload wins over a load** of the same topic (:meth:`BrokerService.unload`): while it
runs, a client is told to retry rather than load a second instance beside the one being
closed (:func:`check_not_leaving`), and a load in flight is let go as it ends
(:func:`check_not_unloaded`), never served after the unload.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from segtxn.ledger import LedgerError, WriteFailed, movable
from segtxn.metastore import MetadataStoreError
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import TopicName
from segtxn.topics.catalog import HOMES, HOMES_BY_BROKER, NoBrokers

if TYPE_CHECKING:
    from segtxn.broker.service import BrokerService
    from segtxn.broker.topic import Topic

log = logging.getLogger(__name__)


async def drain(service: BrokerService) -> dict[str, Any]:
    """Move every home of ``service``'s broker elsewhere; ``{"broker", "moved": [names],
    "failed": {name: why}}``.

    Raises:
        ServerError: NotAllowed without replication (its topics cannot move);
            ServiceNotReady when no other broker can take them.
    """
    if service.replica_nodes is None:
        raise ServerError(
            ErrorName.NOT_ALLOWED,
            f"broker {service.broker_id} keeps its ledgers on its own disk (no --replication): "
            "its topics cannot move to another broker",
        )
    await service.set_draining(True)
    listing = await service.store.index_range(HOMES_BY_BROKER, service.broker_id)
    names = [TopicName.parse(unquote(e.key[len(HOMES) :])) for e in listing.entries]
    moved: list[str] = []
    failed: dict[str, str] = {}
    for name in names:
        try:
            await _move(service, name)
            moved.append(str(name))
        except NoBrokers as e:
            raise ServerError(
                ErrorName.SERVICE_NOT_READY, f"no other broker can take {name}: {e}"
            ) from e
        except (LedgerError, MetadataStoreError, ServerError) as e:
            log.warning("draining broker %s: %s stays here: %s", service.broker_id, name, e)
            failed[str(name)] = str(e)
    log.info(
        "broker %s drained: %d topics and segments moved, %d stay",
        service.broker_id,
        len(moved),
        len(failed),
    )
    return {"broker": service.broker_id, "moved": moved, "failed": failed}


async def _move(service: BrokerService, name: TopicName) -> None:
    """Hand ``name`` to the live broker with the fewest homes.

    Raises:
        ServerError: NotAllowed, a ledger of it was written before replication was turned
            on and lives on this broker's disk alone (it stays here, served).
    """
    if not await movable(str(name), service.store):
        raise ServerError(
            ErrorName.NOT_ALLOWED,
            f"{name}: a ledger of it was written before replication was turned on and is "
            f"on broker {service.broker_id}'s disk alone: it cannot move",
        )
    (target,) = await service.catalog.place(1)
    if name in service.moving:  # being retired (or moved) already: not twice at once
        raise ServerError(ErrorName.SERVICE_NOT_READY, f"{name} is busy moving or retiring")
    service.moving.add(name)
    try:
        await service.unload(name)
        await service.catalog.move_home(name, away_from=service.broker_id, to=target)
    finally:
        service.moving.discard(name)


async def check_still_home(service: BrokerService, topic: Topic) -> None:
    """Called when ``topic`` has just loaded, before it is served: a drain may have moved
    it meanwhile (it was not in ``service.topics`` to unload). Between this check and the
    caller's ``topics[name] = topic`` nothing yields, so a move that starts later finds it.

    Raises:
        ServerError: ServiceNotReady, it lives elsewhere now (the topic is let go).
        MetadataStoreError: its home cannot be read (the topic is let go).
    """
    try:
        home = await service.catalog.home_of(topic.name)
    except BaseException:
        await let_go(topic)
        raise
    if home != service.broker_id or topic.name in service.moving:
        await let_go(topic)
        raise ServerError(
            ErrorName.SERVICE_NOT_READY, f"{topic.name} moved while it was loading; try again"
        )


def check_not_leaving(service: BrokerService, name: TopicName) -> None:
    """Refuse to load ``name`` while it leaves this broker: moved by a drain, or being
    unloaded (:meth:`BrokerService.unload`), so that a load never opens its ledger beside
    the instance being closed. The client is told to retry, and finds it loaded again here
    or where it lives then.

    Raises:
        ServerError: ServiceNotReady.
    """
    if name in service.moving:
        raise ServerError(
            ErrorName.SERVICE_NOT_READY, f"{name} is moving to another broker; try again"
        )
    if service.is_unloading(name):
        raise ServerError(
            ErrorName.SERVICE_NOT_READY,
            f"{name} is being unloaded from broker {service.broker_id}; try again",
        )


async def check_not_unloaded(service: BrokerService, topic: Topic) -> None:
    """Called when ``topic`` has just loaded, before it is served: an unload that began
    while it was loading waits for this load, and wins (the topic is let go). Between this
    check and the caller's ``topics[name] = topic`` nothing yields, so an unload that starts
    later finds it in the broker's topics.

    Raises:
        ServerError: ServiceNotReady, it is being unloaded (the topic is let go).
    """
    if service.is_unloading(topic.name):
        await let_go(topic)
        raise ServerError(
            ErrorName.SERVICE_NOT_READY,
            f"{topic.name} was unloaded from broker {service.broker_id} while it was "
            "loading; try again",
        )


def write_failed(service: BrokerService, topic: Topic, failure: WriteFailed) -> None:
    """Unload ``topic`` if its ledger stopped for a reason reopening may cure (retriable);
    damage is not one: that topic stays, refusing appends.

    The unload runs in the background (this is the ledger's callback) under the guard of
    :meth:`BrokerService.unload`: until the old instance is closed (its ledger's file lock
    let go), a client asking for the topic is told to retry rather than load a second
    instance beside it, which the lock would refuse as if the ledger were broken."""
    name = topic.name
    if not failure.retriable or service.topics.get(name) is not topic:
        return
    service.unloads.begin(name)  # in the same step as the topic leaves the broker's topics
    del service.topics[name]
    log.warning("%s: unloading it (%s); the next client reopens it", name, failure)

    async def drop() -> None:
        try:
            await let_go(topic)
        finally:
            service.unloads.end(name)

    dropping = asyncio.create_task(drop(), name=f"drop-{name}")
    service.dropping.add(dropping)
    dropping.add_done_callback(service.dropping.discard)


async def unload_idle(service: BrokerService, now: float) -> None:
    """Unload the topics seen :meth:`~Topic.idle` at two sweeps at least
    ``unload_idle_s`` apart (0: never)."""
    limit = service.settings.unload_idle_s
    if not limit:
        return
    for name, topic in list(service.topics.items()):
        if not topic.idle():
            topic.idle_since = None
        elif topic.idle_since is None:
            topic.idle_since = now
        elif now - topic.idle_since >= limit and service.topics.get(name) is topic:
            log.info("%s: idle for %.0f s (sealed, no client)", name, now - topic.idle_since)
            await service.unload(name)


async def let_go(topic: Topic) -> None:
    """Hang up on the topic's clients and close it (cleanly if it still can)."""
    await topic.disconnect_clients()
    try:
        await topic.close()
    except (LedgerError, MetadataStoreError) as e:  # e.g. fenced: it lives elsewhere
        log.info("%s: closed without a clean close (%s)", topic.name, e)
