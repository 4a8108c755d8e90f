"""One replicated ledger: each batch to every replica, acknowledged once a quorum has it.

A :class:`ReplicatedLog` is written by its one writer (the managed ledger's group commit,
one batch at a time). Each batch goes to every replica still in the ensemble, in order
(one send at a time per replica: a replica only ever holds a prefix), and ``append_batch``
returns once ``ack_quorum`` replicas have synced it; the others catch up behind.

A replica that fails (no answer in time, a gap, an error) leaves this ledger's ensemble
for good. While a quorum remains, writing goes on and ``wants_rollover`` asks the managed
ledger for a new ledger (with a fresh ensemble) at its next write. When the batch cannot
reach a quorum any more, it raises ``LedgerUnwritable``: nothing of it was acknowledged,
the count stays where it was, and the managed ledger closes this ledger there and writes
the batch to the next. A replica that says it is fenced means another owner recovered the
ledger: ``LedgerFenced``.

Reads go to the local replica if it holds the ledger, then to the others in turn.
The managed ledger appends and reads through ``append_batch_async`` and ``read_async``,
coroutines on its loop: no thread waits for a network round trip. The blocking
``append_batch`` and ``read`` (the ``EntryLog`` contract) run them on that loop from a
worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from segtxn.ledger.errors import (
    LedgerCorrupted,
    LedgerError,
    LedgerFenced,
    LedgerUnwritable,
    NotEnoughReplicas,
)
from segtxn.ledger.logs import EntryLog, Placement
from segtxn.ledger.records import ENTRY_OVERHEAD
from segtxn.ledger.replicas.members import Replica

log = logging.getLogger(__name__)

T = TypeVar("T")

RECHECK_S = 1.0
"""How often a ledger on fewer replicas than wanted asks whether more nodes are alive (the
first time one period after it was made: a node that just died stays registered until its
session expires, and a ledger asking at once would roll over at every write meanwhile)."""


def blocking(loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on ``loop`` and wait for it, from a worker thread."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coroutine.close()
        raise RuntimeError("a replicated log's blocking call was made on its event loop")
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result()


class ReplicatedLog(EntryLog):
    def __init__(
        self,
        name: str,
        ledger_id: int,
        replicas: Sequence[Replica],
        *,
        ack_quorum: int,
        loop: asyncio.AbstractEventLoop,
        count: int = 0,
        size: int = 0,
        writable: bool,
        placement: Placement | None = None,
    ) -> None:
        """``replicas``: those to write to (all of the ensemble for a new ledger), or to
        read from (those that hold all ``count`` entries, the local one first)."""
        self.name = name
        self.ledger_id = ledger_id
        self._replicas = list(replicas)
        self._ack_quorum = ack_quorum
        self._loop = loop
        self._count = count
        self._size = size
        self._writable = writable
        self.placement = placement or Placement(tuple(str(r.member) for r in replicas), ack_quorum)
        self.claims: list[tuple[Replica, int]] = []
        """What each replica's create answered (a new ledger's): the failed create of a
        ledger the store refused to name discards them (:meth:`ReplicaNode.discard`)."""
        self._sends: dict[str, asyncio.Future[None]] = {}
        """Each replica's latest send: the next one waits for it (a replica's order)."""
        self._short_of: tuple[int, Callable[[], Awaitable[int]]] | None = None
        self._checked = 0.0
        self._checking: asyncio.Task[None] | None = None

    def short_of(self, write_quorum: int, alive: Callable[[], Awaitable[int]]) -> None:
        """This log went on fewer replicas than ``write_quorum`` (too few nodes were
        alive): after each write, at most once per :data:`RECHECK_S`, ask ``alive`` how
        many are now, and ask for a rollover (a new ledger on a whole ensemble) once
        there are enough. (Its own entries stay on the replicas it has.)"""
        self._short_of = (write_quorum, alive)
        self._checked = self._loop.time()

    @property
    def count(self) -> int:
        return self._count

    def size_bytes(self) -> int:
        return self._size

    def append_batch(self, payloads: Sequence[bytes]) -> None:
        blocking(self._loop, self.append_batch_async(payloads))

    async def append_batch_async(self, payloads: Sequence[bytes]) -> None:
        if not self._writable:
            raise LedgerError(f"ledger {self.ledger_id} of {self.name} is closed to appends")
        await self._append(list(payloads))

    async def _append(self, payloads: list[bytes]) -> None:
        first = self._count
        sends = [self._send(replica, first, payloads) for replica in self._replicas]
        acknowledged = 0
        fenced: LedgerFenced | None = None
        failures: list[str] = []
        for done in asyncio.as_completed(sends):
            try:
                await done
                acknowledged += 1
            except LedgerFenced as e:
                fenced = e
            except LedgerError as e:
                failures.append(str(e))
            if acknowledged >= self._ack_quorum:
                break
            if fenced is not None:
                break
            if len(self._replicas) < self._ack_quorum:
                break
        if fenced is not None:
            self._writable = False
            raise LedgerFenced(
                f"ledger {self.ledger_id} of {self.name} was recovered by another owner: {fenced}"
            )
        if acknowledged < self._ack_quorum:
            self._writable = False
            raise LedgerUnwritable(
                f"ledger {self.ledger_id} of {self.name}: entries {first}.. reached "
                f"{acknowledged} of the {self._ack_quorum} replicas it needs "
                f"({'; '.join(failures) or 'no answer'})"
            )
        self._count = first + len(payloads)
        self._size += sum(len(p) + ENTRY_OVERHEAD for p in payloads)
        self._maybe_recheck()

    def _maybe_recheck(self) -> None:
        if self._short_of is None or self.wants_rollover or self._checking is not None:
            return
        now = self._loop.time()
        if now - self._checked < RECHECK_S:
            return
        self._checked = now
        wanted, alive = self._short_of

        async def check() -> None:
            try:
                if await alive() >= wanted:
                    self.wants_rollover = True
            except Exception as e:  # tried again after a later write
                log.info(
                    "ledger %d of %s: counting storage nodes failed: %s",
                    self.ledger_id,
                    self.name,
                    e,
                )
            finally:
                self._checking = None

        self._checking = asyncio.ensure_future(check())

    def _send(self, replica: Replica, first: int, payloads: list[bytes]) -> asyncio.Future[None]:
        """Send the batch to ``replica`` after its previous one; a failure drops it."""
        key = str(replica.member)
        previous = self._sends.get(key)

        async def send() -> None:
            if previous is not None:
                await asyncio.shield(previous)  # (its failure was dropped: see below)
            if replica not in self._replicas:
                raise LedgerError(f"{replica.member} left the ensemble before this batch")
            try:
                await replica.append(self.name, self.ledger_id, first, payloads, recovery=False)
            except LedgerFenced:
                raise
            except Exception as e:  # whatever it was, this replica did not take the batch
                self._drop(replica, e)
                raise LedgerError(f"{replica.member}: {e}") from None

        sent = asyncio.ensure_future(send())
        settled = self._loop.create_future()

        def settle(task: asyncio.Future[None]) -> None:
            if not settled.done():
                settled.set_result(None)  # the next send only needs this one over
            if not task.cancelled():
                task.exception()  # (retrieved: a straggler's failure is not "never seen")

        sent.add_done_callback(settle)
        self._sends[key] = settled
        return sent

    def _drop(self, replica: Replica, error: BaseException) -> None:
        if replica in self._replicas:
            self._replicas.remove(replica)
            self.wants_rollover = True
            log.warning(
                "ledger %d of %s: replica %s left its ensemble (%s); %d remain",
                self.ledger_id,
                self.name,
                replica.member,
                error,
                len(self._replicas),
            )

    def read(self, first: int, last: int) -> list[bytes]:
        return blocking(self._loop, self.read_async(first, last))

    async def read_async(self, first: int, last: int) -> list[bytes]:
        if last >= self._count:
            raise IndexError(f"ledger {self.ledger_id}: entry {last} is beyond {self._count}")
        out: list[bytes] = []
        while first + len(out) <= last:
            out += await self._read_some(first + len(out), last)
        return out

    async def _read_some(self, first: int, last: int) -> list[bytes]:
        """Entries from ``first`` (one read: maybe not all to ``last``) from the first
        replica that serves them."""
        problems: list[str] = []
        corrupted: LedgerCorrupted | None = None
        damaged = 0  # the replicas that answered with damage (every one: the data is)
        for replica in list(self._replicas):
            try:
                return await replica.read(self.name, self.ledger_id, first, last)
            except LedgerCorrupted as e:
                corrupted, damaged = e, damaged + 1
                problems.append(str(e))
            except LedgerError as e:
                problems.append(str(e))
        message = (
            f"ledger {self.ledger_id} of {self.name}: no replica served entries "
            f"{first}..{last} ({'; '.join(problems) or 'no replica holds it'})"
        )
        if corrupted is not None and damaged == len(self._replicas):
            raise LedgerCorrupted(message, path=corrupted.path)
        raise NotEnoughReplicas(message)  # (a good copy may be back in a moment)

    def close(self) -> None:
        """Take no more appends, and let the sends still going to slower replicas end
        (each is bounded by its replica's timeout): a clean close leaves every replica
        that answers holding every entry."""
        self._writable = False
        self._short_of = None  # (no more checks; one in flight only sets a flag)
        sends, self._sends = list(self._sends.values()), {}
        if sends:
            blocking(self._loop, asyncio.wait(sends))
