"""Readers: a cursor-less, forward-only view of a topic or segment from a start position.

A reader acknowledges nothing and keeps no state in the store; it delivers committed data
only (like a consumer) as its client's permits allow. It ends (``end_of_topic``) at the end
of a sealed ledger, or once it has passed ``end`` (inclusive) when one is given.

If the ledger cannot be read on (a damaged or missing ledger file), the reader stops where
it is and sends an ``Error`` frame (``PersistenceError``, naming the file), again whenever
its client grants more permits; it never goes silent.
"""

from __future__ import annotations

import asyncio
import logging

from segtxn.broker.delivery import ConsumerLink, Follower, readable, to_message, visible
from segtxn.broker.txn.visibility import TransactionBuffer
from segtxn.ledger import LedgerClosed, LedgerError, ManagedLedger, Position
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import EndOfTopic, Error
from segtxn.protocol.limits import parse_position

log = logging.getLogger(__name__)


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
        self._failed: Error | None = None
        buffer.on_change(self._wake.set)
        self._follower = Follower(ledger, self._wake, f"{ledger.name}/reader-{link.id}")
        self._task = asyncio.create_task(self._run(), name=f"reader-{ledger.name}-{link.id}")

    def flow(self, permits: int) -> None:
        if permits <= 0:
            raise ServerError(
                ErrorName.INVALID_ARGUMENT, f"permits must be positive, not {permits}"
            )
        self.link.permits = min(self.link.permits + permits, self._max_permits)
        if self._failed is not None:  # it asks for more: tell it again why none come
            self.link.send(self._failed)
        self._wake.set()

    async def _run(self) -> None:
        try:
            await self._deliver()
        except LedgerClosed:
            return  # the topic is being unloaded: its connections close
        except LedgerError as e:
            self._fail(ErrorName.PERSISTENCE, e)
        except Exception as e:
            log.exception("reader %s of %s failed", self.link.name, self.ledger.name)
            self._fail(ErrorName.UNKNOWN, e)

    def _fail(self, name: ErrorName, error: Exception) -> None:
        log.warning(
            "%s: reader %s stopped at %s: %s", self.ledger.name, self.link.name, self._next, error
        )
        self._failed = Error(
            error=name, message=f"{self.ledger.name}: cannot read on from {self._next}: {error}"
        )
        self.link.send(self._failed)

    async def _deliver(self) -> None:
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
                    if self._end is not None and entry.position > self._end:
                        # The batch may run past ``end``: nothing after it is sent.
                        self._next = entry.position
                        break
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


NOTHING = Position(-1, -1)
"""A reader's end before any entry: it ends at once (``end=-1:-1``, what ``latest`` is on a
topic that holds nothing)."""


def end_position(ledger: ManagedLedger, end: str | None) -> Position | None:
    """Where a reader stops (inclusive): ``latest`` is the last entry stored now."""
    if end is None:
        return None
    if end == "latest":
        last = ledger.last_confirmed
        return last if last is not None else NOTHING  # nothing stored: end at once
    if end == str(NOTHING):
        return NOTHING
    return Position(*parse_position(end, "end (latest or LEDGER:ENTRY)"))


def start_position(ledger: ManagedLedger, start: str) -> Position:
    """Where a reader starts: ``earliest``, ``latest`` or a ``LEDGER:ENTRY`` in range."""
    if start == "earliest":
        return ledger.first_position() or ledger.next_write_position()
    if start == "latest":
        return ledger.next_write_position()
    position = Position(*parse_position(start, "start (earliest, latest or LEDGER:ENTRY)"))
    if position > ledger.next_write_position():
        raise ServerError(
            ErrorName.INVALID_ARGUMENT,
            f"start={position} is beyond the end of {ledger.name} "
            f"(its next message is {ledger.next_write_position()}); use latest",
        )
    return position
