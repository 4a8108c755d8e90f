"""Group commit: the managed ledger's bounded write queue and the one task that drains it.

Every append waiting while a batch is being written and synced joins the next batch, so
concurrent appends share one ``fdatasync``. A batch is bounded by ``max_batch_bytes``
counted on disk, record headers included (that bounds what a crash can tear), and, if set,
waits at most ``max_batch_delay_s`` to fill. Appends wait (backpressure, first come first
served) while ``max_pending_bytes`` are queued. Entries are written in the order they were
queued.

The first failed write stops the writer: that batch and everything queued fail with
``LedgerError``, and so does every later append, until the ledger is reopened (a write
that failed half-way leaves the file in a state only recovery may judge). So does a halt
(:meth:`GroupCommit.halt`). Once stopped, nothing is queued any more: an append that
waited for room is refused when it gets it, as the task that drained the queue may have
ended (queued, it was never answered, and the ledger's close, waiting for an idle
writer, never returned).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from segtxn.ledger.errors import LedgerClosed, LedgerError, LedgerFenced, WriteFailed
from segtxn.ledger.metadata import LedgerSettings
from segtxn.ledger.position import Position
from segtxn.ledger.records import ENTRY_OVERHEAD

log = logging.getLogger(__name__)

WriteBatch = Callable[[list[bytes]], Awaitable[list[Position]]]
"""Writes a batch durably (and marks it acknowledged); returns the entries' positions."""


@dataclass
class WriteStats:
    """Counters of the group-commit writer (what the metrics export)."""

    entries: int = 0
    batches: int = 0
    """Synced batches: ``entries / batches`` is the average group-commit size."""
    bytes: int = 0
    rollovers: int = 0
    largest_batch_bytes: int = 0
    """The largest batch on disk, record headers included (bounded by max_batch_bytes,
    or one entry's size)."""


@dataclass(eq=False, slots=True)
class _Pending:
    payload: bytes
    done: asyncio.Future[Position]


class GroupCommit:
    """Owned by one managed ledger; :meth:`close` stops its task."""

    def __init__(
        self,
        name: str,
        settings: LedgerSettings,
        write: WriteBatch,
        on_failure: Callable[[WriteFailed], None],
    ) -> None:
        self._name = name
        self._settings = settings
        self._write = write
        self._on_failure = on_failure
        self._queue: deque[_Pending] = deque()
        self._queued_bytes = 0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()  # the queue fell below max_pending_bytes
        self._drained.set()
        self.idle = asyncio.Event()
        """Set while nothing is queued and nothing is being written."""
        self.idle.set()
        self._admission = asyncio.Lock()  # appends wait for room first come, first served
        self._admitting = 0  # appends holding or waiting for _admission
        self.failure: BaseException | None = None
        """The write that stopped the writer (None while it runs)."""
        self._batch: list[_Pending] = []  # being written
        self.told: WriteFailed | None = None
        """What ``on_failure`` was told (None: not yet), for a listener that comes later."""
        self._task = asyncio.create_task(self._run(), name=f"ledger-writer-{name}")

    async def enqueue(self, payload: bytes, check: Callable[[], None]) -> asyncio.Future[Position]:
        """Queue ``payload`` once there is room; ``check`` raises if the ledger no longer
        takes appends (called after any wait for room, and once more right before
        queueing: the writer may have stopped while this append waited for the lock)."""
        if (queued := self.enqueue_now(payload)) is not None:
            return queued  # nobody waits for room: no lock to take
        self._admitting += 1
        try:
            async with self._admission:  # FIFO: a waiting append is never overtaken
                while not self._has_room(len(payload)):
                    self._drained.clear()
                    await self._drained.wait()
                    check()
                check()
                return self._push(payload)
        finally:
            self._admitting -= 1

    def enqueue_now(self, payload: bytes) -> asyncio.Future[Position] | None:
        """Queue ``payload`` if that needs no wait (there is room, and no append waits for
        room before it); else None, and nothing was queued."""
        if self._admitting == 0 and self._has_room(len(payload)):
            return self._push(payload)
        return None

    def _has_room(self, size: int) -> bool:
        return not self._queue or self._queued_bytes + size <= self._settings.max_pending_bytes

    def _push(self, payload: bytes) -> asyncio.Future[Position]:
        """Queue ``payload``, unless the writer stopped (failed, halted, closed): then its
        future fails at once, as nothing would write it (never queued, never unanswered)."""
        pending = _Pending(payload, asyncio.get_running_loop().create_future())
        if self.failure is not None or self._task.done():
            pending.done.set_exception(self._refusal())
            return pending.done
        self._queue.append(pending)
        self._queued_bytes += len(payload)
        self.idle.clear()
        self._wake.set()
        return pending.done

    def _refusal(self) -> LedgerError:
        if self.failure is not None:
            return WriteFailed(f"write failed: {self.failure}", self.failure)
        return LedgerClosed(f"{self._name} was closed before this append was written")

    async def _run(self) -> None:
        try:
            await self._drain()
        except Exception as e:  # a bug of its own: whatever is queued must still settle
            self._fail(self._batch, e)  # (logged there, with its traceback)

    async def _drain(self) -> None:
        while True:
            await self._wake.wait()
            if (
                self._settings.max_batch_delay_s
                and self._queued_bytes < self._settings.max_batch_bytes
            ):
                await asyncio.sleep(self._settings.max_batch_delay_s)
            batch = self._batch = self._take_batch()
            if not batch:
                self._wake.clear()
                self.idle.set()
                continue
            writing = asyncio.ensure_future(self._write([p.payload for p in batch]))
            try:
                positions = await asyncio.shield(writing)
            except asyncio.CancelledError:
                # Stopped mid-write (a close that was itself cancelled): the write's thread
                # cannot be stopped, and the files must not be closed under it. It ends
                # first, and its batch is answered (left unanswered, its appends hung).
                await asyncio.wait([writing])
                if writing.exception() is None:
                    self._answer(batch, writing.result())
                else:
                    self._fail(batch, writing.exception())  # type: ignore[arg-type]
                raise
            except Exception as e:
                self._fail(batch, e)
                return
            self._answer(batch, positions)
            self._batch = []

    @staticmethod
    def _answer(batch: list[_Pending], positions: list[Position]) -> None:
        for pending, position in zip(batch, positions, strict=True):
            if not pending.done.done():
                pending.done.set_result(position)

    def halt(self, error: Exception) -> None:
        """Stop taking appends as after a failed write, for ``error`` (the ledger can no
        longer tell where they would go): what is queued fails, and the owner is told once
        (``on_failure``), to reopen the ledger. A batch already taken is refused by the
        ledger's own write, which checks :attr:`failure` before writing it.

        A fence after a failure that was not retriable (damage: its owner keeps the ledger,
        refusing appends) is told too, once: another owner has the ledger now, and this
        one must let it go."""
        damaged = self.told is not None and not self.told.retriable
        if self.failure is None or (damaged and isinstance(error, LedgerFenced)):
            log.warning("%s: %s; refusing appends until reopened", self._name, error)
            self.failure = error
            self._refuse([], error, tell=True)

    def _fail(self, batch: list[_Pending], error: Exception) -> None:
        first = self.failure is None  # else halted while this batch waited: told already
        if first:
            if (isinstance(error, LedgerError) and error.retriable) or isinstance(
                error, LedgerFenced
            ):
                log.warning(
                    "%s: write failed (%s); refusing appends until reopened", self._name, error
                )
            else:
                log.exception(
                    "%s: write failed; the ledger refuses appends until reopened", self._name
                )
            self.failure = error
        self._refuse(batch, self.failure or error, tell=first)

    def _refuse(self, batch: list[_Pending], failure: BaseException, *, tell: bool) -> None:
        """Fail ``batch`` and everything queued with ``failure``; ``tell``: the owner too
        (once per writer)."""
        failed = WriteFailed(f"write failed: {failure}", failure)
        for pending in [*batch, *self._queue]:
            if not pending.done.done():
                pending.done.set_exception(failed)
        self._queue.clear()
        self._queued_bytes = 0
        self._drained.set()
        self.idle.set()
        if tell:
            self.told = failed
            self._on_failure(failed)

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        on_disk = 0  # records count with their headers: this bounds what a crash can tear
        while self._queue and (
            not batch
            or on_disk + len(self._queue[0].payload) + ENTRY_OVERHEAD
            <= self._settings.max_batch_bytes
        ):
            pending = self._queue.popleft()
            batch.append(pending)
            size += len(pending.payload)
            on_disk += len(pending.payload) + ENTRY_OVERHEAD
        self._queued_bytes -= size
        if self._queued_bytes < self._settings.max_pending_bytes:
            self._drained.set()
        return batch

    async def close(self) -> None:
        """Stop writing (a batch being written ends first); what is still queued fails."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        closed = LedgerClosed(f"{self._name} was closed before this append was written")
        for pending in self._queue:
            if not pending.done.done():
                pending.done.set_exception(closed)
        self._queue.clear()
