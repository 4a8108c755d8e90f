"""The start-up check of a broker's data: every topic and segment homed here must find its
ledger files, and each must be its own (the nonce in its header is the one its metadata
recorded), or it is refused (never recreated empty, never served from another's files).

A broker started on an empty or wrong volume would otherwise serve its topics from nothing
and lose what they held, or, on another cluster's volume (or an old copy) holding files of
the same names, be ready and fail each topic only when it is used; refused topics make
it unready (:func:`readiness`) until the volume is mounted or they are restored.
A RETIRED segment is the exception: its files may be gone because its delete was cut
short (segtxn/broker/retire.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from segtxn.broker import deletemark, retire
from segtxn.ledger import LedgerMismatch, LedgerMissing, check_files
from segtxn.metastore import StoreAccessDenied
from segtxn.protocol.names import Domain, TopicName
from segtxn.topics.catalog import HOMES, HOMES_BY_BROKER

if TYPE_CHECKING:
    from segtxn.broker.service import BrokerService

log = logging.getLogger(__name__)

DATA_CHECKS = 16
"""Ledgers checked at once at start-up (each is a store read and a few stat calls)."""


async def check_data(service: BrokerService) -> None:
    """Refuse (and log) every topic homed at ``service`` whose ledger files are missing,
    or are not its own."""
    listing = await service.store.index_range(HOMES_BY_BROKER, service.broker_id)
    names = [TopicName.parse(unquote(e.key[len(HOMES) :])) for e in listing.entries]
    limit = asyncio.Semaphore(DATA_CHECKS)

    async def check(name: TopicName) -> None:
        async with limit:
            try:
                await check_files(str(name), service.store, service.storage)
            except LedgerMissing as e:
                # a RETIRED segment's files may be gone, or a persistent topic's marked
                # deleting (deletemark): its delete was cut short, and is finished later
                if (
                    not (
                        name.domain is Domain.SEGMENT
                        and await retire.is_retired(service.catalog, name)
                    )
                    and await deletemark.marked(service.catalog, name) is None
                ):
                    service.refuse(name, e)
            except LedgerMismatch as e:  # (nothing explains another's file: not a retirement)
                service.refuse(name, e)

    async with asyncio.TaskGroup() as group:
        for name in names:
            group.create_task(check(name), name=f"data-check-{name}")
    missing = sum(isinstance(e, LedgerMissing) for e in service.refused.values())
    foreign = sum(isinstance(e, LedgerMismatch) for e in service.refused.values())
    if missing or foreign:
        log.error(
            "broker %s: of the %d topics and segments homed here, %d have no ledger files "
            "in %s and %d find files there that are not theirs (another cluster's, or an "
            "old copy): the data directory is empty or not this broker's volume. They are "
            "refused (never recreated empty, never served from another's files) and the "
            "broker is not ready until the volume holding them is mounted or they are "
            "restored",
            service.broker_id,
            len(names),
            missing,
            service.settings.ledger_url,
            foreign,
        )


def readiness(
    service: BrokerService, denied: StoreAccessDenied | None = None
) -> tuple[bool, dict[str, Any]]:
    """Whether ``service``'s broker is ready (registered, its data directory holds every ledger
    the store says it holds, and the store does not refuse its credentials: ``denied``,
    :func:`~segtxn.metastore.access_denied`) and the ``/readyz`` body: ``{"ready":
    ...}``, with ``reason`` and ``refused`` (topic -> why) when topics are refused."""
    wrong = (LedgerMissing, LedgerMismatch)  # an empty or wrong volume
    missing = {n: e for n, e in service.refused.items() if isinstance(e, wrong)}
    ready = service.ready.is_set() and not missing and denied is None
    body: dict[str, Any] = {"ready": ready}
    if denied is not None:
        body["reason"] = f"the metadata store refuses the broker's credentials: {denied}"
    elif missing:
        body["reason"] = (
            f"{len(missing)} topic(s) or segment(s) homed on broker {service.broker_id} have "
            f"no ledger files in its data directory ({service.settings.ledger_url}), or "
            "files there that are not theirs: it is empty or not this broker's volume; "
            "they are refused until it is fixed"
        )
    elif not service.ready.is_set():
        body["reason"] = service.registration.trouble or "not registered in the metadata store"
    if service.refused:
        body["refused"] = {str(n): str(e) for n, e in service.refused.items()}
    return ready, body
