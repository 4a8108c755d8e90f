"""Fencing: what a broker does while it cannot prove that it holds its id.

A broker's claim on the topics homed on it is its registration (the record
``/brokers/<id>`` on its session: :mod:`segtxn.broker.registration`). When it is paused or
cut off from the store past its session's TTL, its record goes: other brokers may then
take its topics over (with replication), or another process may register its id (a
duplicate started meanwhile, with another data directory). What the store lets a broker
prove, and so what this module relies on:

- **Its session is alive** until the send time of its last successful keep-alive plus the
  TTL the store granted (:meth:`~segtxn.metastore.Session.alive`): until then its record is
  there, so nobody else can register its id or take its topics over.
- **A topic it has loaded is still its own** when the topic's home record names its id and
  the topic's ledger metadata record is still at the version this broker last wrote:
  whoever else opened that ledger meanwhile (a take-over, a duplicate) changed the record,
  as every open does.

From the moment it cannot prove the first (its session expired, or is past that time, or
its record was deleted or written by another session) until it has claimed its id again
and checked the second for each topic it has loaded, the broker is **fenced**:

- it loads nothing and accepts no producer, consumer or reader (``ServiceNotReady``;
  clients retry, and reach the rightful owner through lookup);
- it sends no receipt: a producer whose send is stored meanwhile is hung up on instead,
  and sends it again once reconnected (de-duplication keeps one copy wherever it lands);
- when it finds another live process holding its id, it lets go of every topic it has
  loaded (:func:`let_go_all`): their clients are hung up on and go to the holder;
- once it holds its id again it keeps the topics still provably its own, and their clients
  stay connected (the store was merely unreachable, or it was paused, and nobody took
  over), and lets go of the others (:func:`revalidate`).

Consumers already connected are still dispatched to meanwhile: a message delivered by a
broker that is no longer the owner may come again from the new one (a duplicate, never a
loss). The writes a replaced broker could still try are refused by the store or the
replicas whatever it believes: ledger appends (recovery fences the replicas), its ledger
metadata, cursors, op records and de-duplication snapshots (conditional on the ledger's
metadata version).

Before this (tests/broker/test_lost_registration.py), a broker resumed while a duplicate
held its id kept serving its connected clients and still loaded topics for clients that
reached it, recovering their ledgers from under the duplicate: the two took each topic
from each other, and the holder's producers were refused for what the other did.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING

from segtxn.aio import first_completed
from segtxn.broker.handoff import let_go
from segtxn.ledger.metadata import metadata_key
from segtxn.metastore import MetadataStoreError
from segtxn.protocol.errors import ErrorName, ServerError

if TYPE_CHECKING:
    from segtxn.broker.service import BrokerService

log = logging.getLogger(__name__)


def why(service: BrokerService) -> str | None:
    """Why ``service`` cannot prove now that it holds its id and its topics (None: it can)."""
    if service.fenced is not None:
        return service.fenced
    return service.registration.unproven()


def refusal(service: BrokerService) -> ServerError | None:
    """The ServiceNotReady refusing a client while ``service`` is fenced (None: it is not)."""
    reason = why(service)
    if reason is None:
        return None
    return ServerError(
        ErrorName.SERVICE_NOT_READY,
        f"broker {service.broker_id} cannot prove it holds its id now ({reason}); "
        "try again (lookup finds the broker that does)",
    )


def check(service: BrokerService) -> None:
    """Raises ServerError(ServiceNotReady) while ``service`` is fenced."""
    refused = refusal(service)
    if refused is not None:
        raise refused


async def let_go_all(service: BrokerService, holder: str) -> None:
    """Let go of every topic loaded here: another live process, ``holder``, has the id,
    and with it the topics (their clients are hung up on and find it through lookup)."""
    names = list(service.topics)
    if names:
        log.warning(
            "broker %s: its id is held by %s: letting go of the %d topics and segments "
            "loaded here (their clients reconnect there)",
            service.broker_id, holder, len(names),
        )  # fmt: skip
    for name in names:
        topic = service.topics.pop(name, None)
        if topic is not None:
            await let_go(topic)


async def revalidate(service: BrokerService) -> None:
    """Having claimed its id again, keep each loaded topic only if it is provably still
    this broker's (homed here, its ledger metadata at the version this broker last wrote);
    let go of the others, and of those it cannot check now (their next client loads them
    again, here or where they live).

    It runs while the broker is still fenced (:func:`keep_registered` lifts the fence only
    once it has returned), as :func:`let_go_all` does (inside the claim), so no client
    loads a topic let go here beside the instance still closing: it is told to retry
    (``ServiceNotReady``) until that one is closed. Letting go of them under the unload
    guard (:mod:`segtxn.broker.unloading`) would add nothing while that holds."""
    for name in list(service.topics):
        topic = service.topics.get(name)
        if topic is None:
            continue
        try:
            home = await service.catalog.home_of(name)
            record = await service.store.get(metadata_key(str(name)))
        except MetadataStoreError as e:
            reason = f"its home could not be read ({e})"
        else:
            if home != service.broker_id:
                reason = f"taken over by broker {home} while this one was away"
            elif record is None or record.version != topic.ledger.metadata_version:
                reason = "its ledger was opened by another process while this one was away"
            else:
                continue
        if service.topics.get(name) is not topic:
            continue  # let go meanwhile
        del service.topics[name]
        log.warning("%s: letting go of it: %s", name, reason)
        await let_go(topic)


async def keep_registered(service: BrokerService) -> None:
    """Register again, not ready and fenced meanwhile, when the session expires or the
    record is lost while it lives (:meth:`Registration.lost`); then keep the topics
    still provably this broker's (:func:`revalidate`)."""
    while True:
        session = service.session()
        await first_completed(
            session.expired.wait(), service.registration.lost(), name="broker-registration"
        )
        service.ready.clear()
        service.registration.release()
        if session.is_expired:
            service.registration.trouble = f"session {session.lease_id:#x} expired"
            service.fenced = service.registration.trouble
            log.warning(
                "broker %s: session %#x expired (lease lost: its controller keys are "
                "gone); registering again, fenced meanwhile: %d topics and segments "
                "loaded here get no new client and send no receipt",
                service.broker_id, session.lease_id, len(service.topics),
            )  # fmt: skip
        else:
            service.fenced = service.registration.trouble or "its registration was lost"
            log.warning(
                "broker %s: %s; not ready and fenced until it is registered again: %d "
                "topics and segments loaded here get no new client and send no receipt",
                service.broker_id, service.registration.trouble, len(service.topics),
            )  # fmt: skip
        while True:
            try:
                if session.is_expired:
                    await service.register(refuse=False)
                else:
                    await service.registration.claim(
                        session, refuse=False, taken=functools.partial(let_go_all, service)
                    )
                break
            except MetadataStoreError as e:  # SessionExpired too: a new one next time
                log.warning("broker %s: registration failed (%s); retrying", service.broker_id, e)
                await asyncio.sleep(1.0)  # the store is down: retry at a gentle pace
                session = service.session()
        await revalidate(service)
        service.fenced = None
        log.warning(
            "broker %s: registered again; serving the %d topics and segments still its "
            "own",
            service.broker_id, len(service.topics),
        )  # fmt: skip
        service.ready.set()
