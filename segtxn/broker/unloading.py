"""Unloading a topic from this broker, and the guard that makes an unload win over a load
of the same topic.

An unload (a drain's move, an idle unload, a ledger that stopped taking appends: see
:mod:`segtxn.broker.handoff`) hangs up on the topic's clients, so none keeps a link to the
closed instance (they look it up again and reconnect where it lives then), and closes it,
cleanly if it still can. While it runs, the topic is in the :class:`UnloadGuard`: a client
asking for it is told to retry (``ServiceNotReady``) rather than load a second instance
beside the one being closed (whose ledger file's lock would refuse it, as if the ledger
were broken), and a load in flight is waited for and let go as it ends, never served after
the unload (:func:`handoff.check_not_leaving`, :func:`handoff.check_not_unloaded`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from segtxn.broker import handoff
from segtxn.protocol.names import TopicName

if TYPE_CHECKING:
    from segtxn.broker.service import BrokerService

log = logging.getLogger(__name__)


class UnloadGuard:
    """The topics being unloaded now, each with how many unloads of it run."""

    def __init__(self) -> None:
        self._counts: dict[TopicName, int] = {}

    def begin(self, name: TopicName) -> None:
        """Mark ``name`` as being unloaded, until as many :meth:`end` calls. Synchronous,
        so that a caller that takes the topic out of the broker's topics in the same step
        leaves no moment in which a load could open its ledger beside the instance being
        closed."""
        self._counts[name] = self._counts.get(name, 0) + 1

    def end(self, name: TopicName) -> None:
        """End one :meth:`begin` of ``name``."""
        left = self._counts.pop(name) - 1
        if left:
            self._counts[name] = left

    def __contains__(self, name: object) -> bool:
        return name in self._counts


async def unload(service: BrokerService, name: TopicName) -> None:
    """Unload ``name`` if it is loaded or loading on ``service`` (see the module
    docstring): a load in flight is waited for (it lets itself go as it ends), a loaded
    instance is let go (a failed close is logged; its next load recovers it)."""
    service.unloads.begin(name)
    try:
        loading = service.loading(name)
        if loading is not None:  # it lets itself go as it ends (handoff.check_not_unloaded)
            await asyncio.wait([loading])
        topic = service.topics.pop(name, None)
        if topic is not None:
            await handoff.let_go(topic)
            log.info("unloaded %s from broker %s", name, service.broker_id)
    finally:
        service.unloads.end(name)
