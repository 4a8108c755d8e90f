"""What a participant hands the op-record writer (:mod:`segtxn.broker.txn.oprecords`): the
ledger an op record is fenced by (:class:`Owner`), the in-memory side of one record
(:class:`Draft`: what it should hold now and what has landed), and a run of appends being
written (:class:`AppendInFlight`), which a store step waits for so that the run's record
joins it. Kept apart from the writer so that participants depend on these small contracts,
not on how steps are batched and settled; and what the writer queues of a draft
(:class:`Waiting`)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

from segtxn.ledger.errors import LedgerFenced
from segtxn.metastore import Put
from segtxn.protocol.errors import ServerError
from segtxn.protocol.txn import TxnId
from segtxn.topics import transactions as T


class Owner(Protocol):
    """The ledger of the segment an op record is written for (a managed ledger)."""

    @property
    def name(self) -> str: ...

    @property
    def metadata_version(self) -> int: ...

    async def settled_metadata_version(self, *, strict: bool = False) -> int: ...

    def fenced(self, error: LedgerFenced) -> None: ...


class Draft(ABC):
    """The in-memory side of one op record: what it should hold now, and what has landed."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.failed: ServerError | None = None
        """Set when a step writing it failed: it is never written again."""

    @abstractmethod
    def snapshot(self) -> T.OpRecord:
        """What the record should hold now (taken when a step is built)."""

    @abstractmethod
    def landed(self, record: T.OpRecord) -> None:
        """``record`` (an earlier snapshot) is durable."""

    def refuse_if_failed(self) -> None:
        """Raises ServerError: an earlier step writing this record failed."""
        if self.failed is not None:
            raise ServerError(
                self.failed.name,
                "an earlier op record of this transaction could not be written: "
                + self.failed.message,
            )


class AppendInFlight:
    """One run of appends of a transaction being written on this broker: ended (once)
    when its records are queued for a step, or when it will record nothing."""

    __slots__ = ("_all", "_txn", "ended")

    def __init__(self, all_runs: dict[TxnId, set[AppendInFlight]], txn: TxnId) -> None:
        self._all, self._txn = all_runs, txn
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        all_runs.setdefault(txn, set()).add(self)

    def end(self) -> None:
        if self.ended.done():
            return
        self.ended.set_result(None)
        runs = self._all[self._txn]
        runs.discard(self)
        if not runs:
            del self._all[self._txn]


@dataclass(eq=False)
class Waiting:
    """A draft queued for a step of the writer, with the callers waiting for it."""

    draft: Draft
    version: int
    owner: Owner | None
    """The ledger of the segment the record is written for (None: no such check)."""
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    snapshot: T.OpRecord | None = None
    put: Put | None = None
    """What the step writing it holds, and its Put (set when the step is built)."""


def requeue(queue: dict[str, Waiting], chosen: list[Waiting]) -> None:
    """Put the drafts of a step that wrote nothing back in ``queue``, for the next step;
    their waiters go before those of a draft queued again meanwhile."""
    for waiting in chosen:
        waiting.snapshot = waiting.put = None
        newer = queue.get(waiting.draft.key)
        if newer is None:
            queue[waiting.draft.key] = waiting
        else:
            newer.waiters[:0] = waiting.waiters
