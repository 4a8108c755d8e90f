"""Pre-started transactions (``Client(prestart_transactions=True)``): spares opened ahead,
in batches that grow with use.

:class:`Spares` keeps the transactions opened ahead for one protocol and timeout. A start
takes the oldest fresh one; when it takes the last one (or finds none) the next batch begins
opening in the background. A batch of v5 transactions is one NEW_TXN call (``count``) and
one store write whatever its size, so a loop of transactions pays a fraction of a NEW_TXN
each (v4 transactions open one at a time). The size doubles, up to :data:`MAX_BATCH`, each
time a batch is used up while fresh, and halves when a spare goes stale: a client that
starts a transaction now and then keeps opening one at a time.

A spare is used only within :data:`PRESTART_MAX_AGE_S` of its opening (its timeout runs from
then, so it is at most that much shorter); a stale one, and those left at close, are
aborted by the owner's ``abort``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from segtxn import tracing
from segtxn.client.timeouts import Deadline
from segtxn.protocol.limits import MAX_NEW_TXNS
from segtxn.protocol.txn import TxnId

log = logging.getLogger(__name__)

PRESTART_MAX_AGE_S = 1.0
"""A pre-started transaction older than this is aborted instead of used."""
MAX_BATCH = MAX_NEW_TXNS
"""The most v5 transactions opened ahead by one NEW_TXN call."""


@dataclass(frozen=True)
class Opened:
    txn: TxnId
    url: str
    """The coordinator that opened it: END_TXN goes there first (it needs no read there)."""
    at: float
    """Event-loop time of the opening."""


class Spares:
    """The transactions opened ahead for one protocol and timeout (see the module
    docstring). ``open_batch(n)`` opens ``n`` of them (it may return fewer)."""

    def __init__(
        self,
        open_batch: Callable[[int], Coroutine[Any, Any, list[Opened]]],
        abort: Callable[[Opened], None],
        *,
        max_batch: int,
    ) -> None:
        self._open_batch = open_batch
        self._abort = abort
        self._max_batch = max_batch
        self._ready: deque[Opened] = deque()
        self._opening: asyncio.Task[list[Opened]] | None = None
        self.batch = 1
        """How many the next batch opens."""

    async def take(self, deadline: Deadline) -> Opened | None:
        """A fresh spare, or None (the caller opens one itself); waits for a batch being
        opened until ``deadline`` at most."""
        self._drop_stale()
        opening = self._opening
        if not self._ready and opening is not None:
            try:
                async with deadline.timeout():
                    await asyncio.shield(opening)
            except Exception as e:  # failed or late: the caller opens one itself
                log.debug("pre-started transactions not available (%s)", e)
            self._collect(opening)
            self._drop_stale()
        spare = self._ready.popleft() if self._ready else None
        if not self._ready and self._opening is None:
            if spare is not None:  # a whole batch was used while fresh: open more at once
                self.batch = min(self.batch * 2, self._max_batch)
            with tracing.detached():  # the next transactions', not this one's
                task = asyncio.create_task(self._open_batch(self.batch), name="txn-prestart")
            self._opening = task
            task.add_done_callback(self._collect)
        return spare

    def _collect(self, task: asyncio.Task[list[Opened]]) -> None:
        if self._opening is not task or not task.done():
            return
        self._opening = None
        if task.cancelled():
            return
        if (error := task.exception()) is not None:
            log.debug("pre-starting transactions failed (%s)", error)
            return
        self._ready.extend(task.result())

    def _drop_stale(self) -> None:
        now = asyncio.get_running_loop().time()
        stale = False
        while self._ready and now - self._ready[0].at > PRESTART_MAX_AGE_S:
            self._abort(self._ready.popleft())
            stale = True
        if stale:
            self.batch = max(1, self.batch // 2)

    async def close(self) -> list[Opened]:
        """Stop opening ahead; return every spare left (those being opened included)."""
        left = list(self._ready)
        self._ready.clear()
        opening, self._opening = self._opening, None
        if opening is not None:
            opened = (await asyncio.gather(opening, return_exceptions=True))[0]
            if isinstance(opened, list):
                left += opened
        return left
