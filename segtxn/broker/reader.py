"""Readers: a cursor-less, forward-only view of a topic or segment from a start position.

A reader acknowledges nothing and keeps no state in the store; it delivers committed data
only (like a consumer) as its client's permits allow. It ends (``end_of_topic``) at the end
of a sealed ledger, or once it has passed ``end`` (inclusive) when one is given.
"""

from __future__ import annotations

import asyncio

from segtxn.broker.delivery import ConsumerLink, Follower, readable, to_message, visible
from segtxn.broker.txn.buffer import TransactionBuffer
from segtxn.ledger import ManagedLedger, Position
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import EndOfTopic


class Reader:
    def __init__(
        self,
        ledger: ManagedLedger,
        buffer: TransactionBuffer,
        link: ConsumerLink,
        start: Position,
        *,
        batch: int,
        max_permits: int,
        end: Position | None = None,
    ) -> None:
        self.ledger = ledger
        self.buffer = buffer
        self.link = link
        self._next = start
        self._end = end
        self._batch = batch
        self._max_permits = max_permits
        self._wake = asyncio.Event()
        buffer.on_change(self._wake.set)
        self._follower = Follower(ledger, self._wake, f"{ledger.name}/reader-{link.id}")
        self._task = asyncio.create_task(self._run(), name=f"reader-{ledger.name}-{link.id}")

    def flow(self, permits: int) -> None:
        if permits <= 0:
            raise ServerError(
                ErrorName.INVALID_ARGUMENT, f"permits must be positive, not {permits}"
            )
        self.link.permits = min(self.link.permits + permits, self._max_permits)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.link.permits > 0 and not self.link.ended:
                if self._end is not None and self._next > self._end:
                    self._finish()
                    break
                entries, cut = readable(
                    await self.ledger.read(
                        self._next, max_entries=min(self._batch, self.link.permits)
                    ),
                    self.buffer,
                )
                if not entries:
                    if not cut and self.ledger.is_sealed:
                        self._finish()
                    break
                for entry in entries:
                    self._next = Position(entry.position.ledger_id, entry.position.entry_id + 1)
                    if not visible(self.buffer, entry):
                        continue
                    self.link.permits -= 1
                    self.link.send(to_message(entry))

    def _finish(self) -> None:
        if not self.link.ended:
            self.link.ended = True
            self.link.send(EndOfTopic())

    async def close(self) -> None:
        self.buffer.remove_listener(self._wake.set)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._follower.close()
