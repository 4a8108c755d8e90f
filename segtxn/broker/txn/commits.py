"""What a broker knows for the one-step commit (written by
:class:`~segtxn.broker.txn.oprecords.OpRecordWriter`): per transaction, the names of the
operations whose op records it queued, whether a step of it failed here, and the commit a
client asked for, if one did.

A commit is answered once: COMMITTED (the header's compare-and-set landed in an op-record
step, with every record the transaction's operations here needed), or "not here" with a
reason (nothing was decided: the client ends the transaction at its coordinator, as it
would have without asking). "Not here" is the answer whenever the broker cannot be sure
the operations it recorded are exactly the client's: fewer arrived, and none for
:data:`COMMIT_WAIT_S` (or before the transaction's timeout); more or others did (the
digest differs), one of them failed here, the transaction ended meanwhile, or its timeout
passed before its step (past it, its coordinator would refuse the commit too). Names and
digests: :mod:`segtxn.protocol.txnops`.

The counts of a transaction are dropped when its header is final (the header cache tells),
when a step finds it ended, or when the writer closes.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import msgspec

from segtxn.broker.txn.headers import HeaderCache
from segtxn.metastore import Put
from segtxn.protocol import txnops
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T

COMMIT_WAIT_S = 2.0
"""How long a commit waits, with none of the operations it names still missing reaching
this broker's op records, before it is answered "not here": longer than an append on a
slow disk, far shorter than a transaction's timeout (the client then ends the transaction
at its coordinator). Measured from the last one that arrived, so a transaction of ten
thousand operations still arriving is not sent to its coordinator for being large."""


STOPPING = "the broker is stopping"
"""Why a commit is "not here" once the writer closes (asked before or after)."""

RECENT_REFUSALS = 4096
"""Transactions nothing here follows whose operation was refused, remembered (the oldest
forgotten first) so that a commit asked after the refusal is "not here" at once."""


@dataclass(frozen=True)
class CommitAnswer:
    header: T.TxnHeader | None
    """The COMMITTED header, or None: nothing was decided here."""
    reason: str = ""
    """Why not (for the client's log)."""
    aborted: bool = False
    """Not here because the transaction was aborted meanwhile (the header cache told)."""

    @property
    def committed(self) -> bool:
        return self.header is not None


class CommitUnknown(Exception):
    """The broker stopped while a step carrying a commit was in flight: it may have landed."""


class Phase(enum.Enum):
    WAITING = "waiting"
    """For the operations it names: it can still be answered "not here"."""
    WRITING = "writing"
    """In a store step: its answer is that step's."""
    DONE = "done"


@dataclass(eq=False)
class PendingCommit:
    """A client's request to commit ``txn`` here, while it is not answered."""

    txn: TxnId
    ops: int
    digest: int
    header: T.TxnHeader
    """The OPEN header, as read (the compare-and-set's base)."""
    version: int
    trace: str | None
    """The client's ``traceparent``, kept in the final header for the participants' spans."""
    expires: float
    """Loop time after which, still WAITING, it is answered "not here" (moved on each time
    another of its operations is counted, never past the transaction's timeout)."""
    answer: asyncio.Future[CommitAnswer]
    phase: Phase = Phase.WAITING
    final: T.TxnHeader | None = None
    """The COMMITTED header its step writes (set with :meth:`cas`)."""

    def cas(self) -> Put:
        """The header's compare-and-set from OPEN to COMMITTED (for the step carrying it)."""
        self.final = msgspec.structs.replace(
            self.header,
            state=TxnState.COMMITTED,
            finalized_ms=int(time.time() * 1000),
            trace=self.trace,
        )
        return Put(
            T.header_key(self.txn),
            T.encode(self.final),
            expected_version=self.version,
            partition_key=self.txn.key,
            indexes=T.header_indexes(self.final),
        )

    def settle(self, answer: CommitAnswer) -> None:
        self.phase = Phase.DONE
        if not self.answer.done():
            self.answer.set_result(answer)


@dataclass(eq=False)
class _Counted:
    names: set[str] = field(default_factory=set)
    digest: int = 0
    failed: str | None = None
    """Why a step of the transaction failed here (it cannot commit here then)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class Commits:
    """The one-step commit's bookkeeping for one broker (see the module docstring)."""

    def __init__(
        self, headers: HeaderCache | None, held_back: Callable[[], bool] | None = None
    ) -> None:
        """``headers``: tells when a transaction is over (its counts are dropped then);
        None (tests of the writer alone): they are dropped by :meth:`forget` only.
        ``held_back``: whether operations may be held back from arriving now
        (:meth:`wait_counted`); never, if None."""
        self._headers = headers
        self._held_back = held_back
        self._counted: dict[TxnId, _Counted] = {}
        self._pending: dict[TxnId, PendingCommit] = {}
        self._refusals: dict[TxnId, str] = {}
        """Why an operation was refused, for transactions not (yet) counted here (oldest
        first, at most :data:`RECENT_REFUSALS`)."""

    def _entry(self, txn: TxnId) -> _Counted:
        counted = self._counted.get(txn)
        if counted is None:
            counted = self._counted[txn] = _Counted(failed=self._refusals.pop(txn, None))
            if self._headers is not None:
                self._headers.listen(txn, self._on_header)
                cached = self._headers.cached(txn)
                if cached is not None and cached.state.final:
                    self._on_header(txn, cached)  # ended already: nothing to keep
                    return _Counted()
        return counted

    def count(self, txn: TxnId, names: Collection[str]) -> None:
        """The records of operations ``names`` of ``txn`` are queued (or landed already)."""
        counted = self._entry(txn)
        before = len(counted.names)
        for name in names:
            if name not in counted.names:
                counted.names.add(name)
                counted.digest = txnops.add(counted.digest, name)
        pending = self._pending.get(txn)
        if pending is not None and len(counted.names) > before:
            pending.expires = _expiry(pending.header)
        self._changed(txn, counted)

    def failed(self, txn: TxnId, why: str) -> None:
        """A step of ``txn`` failed here: it cannot commit here."""
        counted = self._entry(txn)
        if counted.failed is None:
            counted.failed = why
        self._changed(txn, counted)

    def refused(self, txn: TxnId, why: str) -> None:
        """An operation of ``txn`` was refused here: :meth:`failed`, if anything of it is
        known here; else remembered among the last :data:`RECENT_REFUSALS` (its header may
        never be watched here, so what is kept for it could not be dropped on its outcome:
        a refusal older than those, followed by a commit, costs that commit its wait)."""
        if txn in self._counted or txn in self._pending:
            self.failed(txn, why)
            return
        self._refusals.pop(txn, None)
        self._refusals[txn] = why
        if len(self._refusals) > RECENT_REFUSALS:
            del self._refusals[next(iter(self._refusals))]

    def _changed(self, txn: TxnId, counted: _Counted) -> None:
        counted.changed.set()
        counted.changed = asyncio.Event()
        pending = self._pending.get(txn)
        if pending is not None and pending.phase is Phase.WAITING:
            refusal = self._refusal(pending, counted)
            if refusal is not None:
                self._answer(pending, CommitAnswer(None, refusal))

    @staticmethod
    def _refusal(pending: PendingCommit, counted: _Counted) -> str | None:
        """Why ``pending`` can never match what is counted (None: it may yet)."""
        if counted.failed is not None:
            return _not_recorded(pending.txn, counted.failed)
        if len(counted.names) > pending.ops or (
            len(counted.names) == pending.ops and counted.digest != pending.digest
        ):
            return (
                f"the operations of {pending.txn} recorded here are not the {pending.ops} "
                "the client named"
            )
        return None

    def matched(self, txn: TxnId) -> bool:
        """A commit of ``txn`` waits here, and what is counted is what it names."""
        pending = self._pending.get(txn)
        counted = self._counted.get(txn)
        return (
            pending is not None
            and pending.phase is Phase.WAITING
            and counted is not None
            and counted.failed is None
            and len(counted.names) == pending.ops
            and counted.digest == pending.digest
        )

    def ask(
        self,
        txn: TxnId,
        ops: int,
        digest: int,
        *,
        header: T.TxnHeader,
        version: int,
        trace: str | None,
    ) -> PendingCommit:
        """Register a client's commit (the same one asked again joins it)."""
        pending = self._pending.get(txn)
        loop = asyncio.get_running_loop()
        if pending is not None:
            if (pending.ops, pending.digest) != (ops, digest):
                refused = loop.create_future()
                refused.set_result(
                    CommitAnswer(None, f"another commit of {txn} with other operations waits")
                )
                return PendingCommit(txn, ops, digest, header, version, trace, 0, refused)
            return pending
        pending = self._pending[txn] = PendingCommit(
            txn,
            ops,
            digest,
            header,
            version,
            trace,
            _expiry(header),
            loop.create_future(),
        )
        counted = self._counted.get(txn)
        refusal_here = self._refusals.get(txn)
        if counted is None and refusal_here is not None:
            self._answer(pending, CommitAnswer(None, _not_recorded(txn, refusal_here)))
        elif counted is not None:
            refusal = self._refusal(pending, counted)
            if refusal is not None:
                self._answer(pending, CommitAnswer(None, refusal))
        return pending

    async def wait_counted(self, txn: TxnId) -> None:
        """While a commit of ``txn`` waits for operations still to come, wait for them
        (until it expires): the step that writes them then carries it. Not while operations
        are held back (``held_back``: producer connections wait for room in the broker's
        publish buffer, segtxn/broker/publish_budget.py), nor once they are
        (:meth:`hurry`): the operations in flight may be what holds the missing ones back,
        and they end only once their records are written; the commit then goes with a
        later step, or in one of its own (a store step more, never a stall)."""
        loop = asyncio.get_running_loop()
        while True:
            pending = self._pending.get(txn)
            if pending is None or pending.phase is not Phase.WAITING or self.matched(txn):
                return
            if self._held_back is not None and self._held_back():
                return
            left = pending.expires - loop.time()
            if left <= 0:
                return
            changed = self._entry(txn).changed
            try:
                async with asyncio.timeout(left):
                    await changed.wait()
            except TimeoutError:
                return

    def hurry(self) -> None:
        """Operations are held back from now on: the steps waiting for a commit's missing
        operations (:meth:`wait_counted`) stop waiting."""
        for txn, pending in self._pending.items():
            counted = self._counted.get(txn)
            if pending.phase is Phase.WAITING and counted is not None:
                counted.changed.set()
                counted.changed = asyncio.Event()

    def due(self, txn: TxnId) -> PendingCommit | None:
        """The commit the next step of ``txn`` carries, if it is ready (now WRITING)."""
        if not self.matched(txn):
            return None
        pending = self._pending[txn]
        if _past(pending.header):  # (what the coordinator would refuse, the broker does too)
            self._answer(pending, CommitAnswer(None, f"{txn} is past its timeout"))
            return None
        pending.phase = Phase.WRITING
        return pending

    def again(self, pending: PendingCommit) -> None:
        """Its step wrote nothing and goes again later: it waits again."""
        if pending.phase is Phase.WRITING:
            pending.phase = Phase.WAITING
            pending.final = None

    def withdraw(self, pending: PendingCommit, why: str) -> bool:
        """Answer ``pending`` "not here" if it still waits (False: a step carries it); or
        "aborted", if the header cache has heard so since the commit read its header (a
        transaction none of whose operations are counted here has no listener to tell it
        sooner)."""
        if pending.phase is Phase.WRITING:
            return False
        cached = None if self._headers is None else self._headers.cached(pending.txn)
        if cached is not None and cached.state is TxnState.ABORTED:
            self._answer(pending, CommitAnswer(None, f"{pending.txn} was aborted", aborted=True))
        else:
            self._answer(pending, CommitAnswer(None, why))
        return True

    def answer(self, pending: PendingCommit, answer: CommitAnswer) -> None:
        """The answer of the step that carried ``pending``: what is counted goes once the
        transaction is over (a change of its header seen while the step was in flight is
        not seen again)."""
        self._answer(pending, answer)
        cached = None if self._headers is None else self._headers.cached(pending.txn)
        if answer.committed or (cached is not None and cached.state.final):
            self.forget(pending.txn)

    def _answer(self, pending: PendingCommit, answer: CommitAnswer) -> None:
        pending.settle(answer)
        if self._pending.get(pending.txn) is pending:
            del self._pending[pending.txn]
        counted = self._counted.get(pending.txn)
        if counted is not None:  # wake a flusher waiting for its operations
            counted.changed.set()
            counted.changed = asyncio.Event()

    def _on_header(self, txn: TxnId, header: T.TxnHeader | None) -> None:
        if header is not None and not header.state.final:
            return
        pending = self._pending.get(txn)
        if pending is not None and pending.phase is Phase.WAITING:
            if header is not None and header.state is TxnState.COMMITTED:
                self._answer(pending, CommitAnswer(header))
            elif header is not None:
                self._answer(pending, CommitAnswer(None, f"{txn} was aborted", aborted=True))
            else:
                self._answer(pending, CommitAnswer(None, f"{txn} ended meanwhile"))
        if pending is None or pending.phase is Phase.DONE:
            self.forget(txn)

    def forget(self, txn: TxnId) -> None:
        """Drop what is known of ``txn`` (it is over); a commit still waiting is answered
        "not here"."""
        pending = self._pending.get(txn)
        if pending is not None and pending.phase is Phase.WAITING:
            self._answer(pending, CommitAnswer(None, f"{txn} ended meanwhile"))
        self._refusals.pop(txn, None)
        if txn in self._counted:
            del self._counted[txn]
            if self._headers is not None:
                self._headers.forget(txn, self._on_header)

    def close(self) -> None:
        """The writer stops: a commit still waiting is answered "not here"; one whose step
        was in flight may have landed, so it gets :class:`CommitUnknown` (never "not here":
        the client would then abort what may be committed)."""
        for pending in list(self._pending.values()):
            if pending.phase is Phase.WAITING:
                pending.settle(CommitAnswer(None, STOPPING))
            elif not pending.answer.done():
                pending.phase = Phase.DONE
                pending.answer.set_exception(
                    CommitUnknown(f"the broker stopped while {pending.txn} was being committed")
                )
                pending.answer.exception()  # retrieved: the caller (if any) re-raises it
        self._pending.clear()
        for txn in list(self._counted):
            self.forget(txn)


def _not_recorded(txn: TxnId, why: str) -> str:
    return f"an operation of {txn} could not be recorded here: {why}"


def _past(header: T.TxnHeader) -> bool:
    """The transaction's timeout has passed (by this broker's clock)."""
    return time.time() * 1000 > header.timeout_ms


def _expiry(header: T.TxnHeader) -> float:
    """When, in loop time, a commit of the transaction of ``header`` stops waiting for its
    operations: :data:`COMMIT_WAIT_S` from now, or at the transaction's timeout if sooner."""
    now = asyncio.get_running_loop().time()
    left_s = max(0.0, header.timeout_ms / 1000 - time.time())
    return now + min(COMMIT_WAIT_S, left_s)
