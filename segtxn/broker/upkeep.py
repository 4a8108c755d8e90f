"""A broker's periodic upkeep: retention, idle unloads and retiring sealed segments.

Every ``retention_check_s`` it trims what retention lets go on each loaded topic
(:meth:`Topic.trim`), unloads sealed topics left idle (:func:`handoff.unload_idle`), and,
every ``retire_check_s``, retires the sealed segments homed here that are consumed and past
retention (:func:`retire.retire_segments`). A failure is logged and the next round tries
again: none of this is on a client's path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from segtxn.broker import handoff, retire
from segtxn.metastore import MetadataStoreError

if TYPE_CHECKING:
    from segtxn.broker.service import BrokerService

log = logging.getLogger(__name__)


async def run(service: BrokerService) -> None:
    """Run the upkeep until cancelled."""
    settings = service.settings
    retire_at = time.monotonic() + settings.retire_check_s
    while True:
        await asyncio.sleep(settings.retention_check_s)  # a schedule, not a wait
        for topic in list(service.topics.values()):
            try:
                result = await topic.trim()
                if result.ledgers:
                    log.info("%s: trimmed ledgers %s", topic.name, result.ledgers)
            except Exception:
                log.exception("%s: retention failed", topic.name)
        try:
            await handoff.unload_idle(service, time.monotonic())
        except Exception:
            log.exception("unloading idle topics failed; trying at the next round")
        if settings.retire_check_s and time.monotonic() >= retire_at:
            retire_at = time.monotonic() + settings.retire_check_s
            try:
                await retire.retire_segments(service)
            except MetadataStoreError as e:
                log.warning("retiring sealed segments: %s; trying at the next round", e)
            except Exception:  # a file the OS refuses to delete...: the upkeep goes on
                log.exception("retiring sealed segments failed; trying at the next round")
