"""A transaction as its sends and acknowledgments join it: the half of
:class:`~segtxn.client.transaction.Transaction` (which extends this) that producers and
consumers call, and that its end builds on.

It holds what a transaction is while it runs: its id once opened, its state and the moves
between them (``NEXT``; an illegal one raises ClientError), its span, and its operations
(:mod:`segtxn.client.txnoperations`). The first send or acknowledgment opens it: NEW_TXN
once, with the protocol its topic's domain calls for, however many operations arrive
together (the others wait for that one, each within its own limit). Each topic and
subscription then joins it once: a v4 ADD_PARTITION / ADD_SUBSCRIPTION
(:mod:`segtxn.client.registrations`); a v5 transaction only checks the domain. An operation
opening it or registering its topic is counted in it meanwhile (``operations.joining``; a
send is from its call, while it waits for room in its producer's window too), so an end
that comes then waits for it instead of ending without it.

Apart from its end (``commit``, ``abort``, leaving ``async with``:
:mod:`segtxn.client.transaction`) because the two halves have different callers and
contracts: this one is the participants' (every send and ack goes through it, cheap once
joined; what it raises fails that operation and poisons the transaction), the end is the
application's (waiting for the operations, END_TXN, the one-step commit, lost answers).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Self, TypeVar

from segtxn import tracing
from segtxn.client.coordinators import Coordinators
from segtxn.client.errors import ClientClosed, ClientError, Timeout
from segtxn.client.onestep import Placements
from segtxn.client.registrations import Registrations
from segtxn.client.timeouts import Deadline
from segtxn.client.txnoperations import Operations
from segtxn.client.txnstates import NEXT, TransactionEnded, TransactionState
from segtxn.protocol.errors import ErrorCategory, NotAllowed
from segtxn.protocol.txn import TxnId

__all__ = ["Joinable"]

_T = TypeVar("_T")

_ENDED = (TransactionState.COMMITTED, TransactionState.ABORTED)


class Joinable:
    """The participants' half of a transaction (see the module docstring);
    :class:`~segtxn.client.transaction.Transaction` is the whole."""

    def __init__(
        self,
        coordinators: Coordinators,
        timeout_s: float,
        *,
        one_step: bool = False,
        after: Joinable | None = None,
    ) -> None:
        """NEW: nothing is asked of a coordinator until it starts (see ``Transaction``).
        ``after``: the transaction this one follows (see ``Transaction``), if any."""
        self.after = after
        """The transaction this one follows until its commit has learned how that one
        ended (then None, so that a long chain of them is not kept alive)."""
        self._ended = asyncio.Event()
        """Set once it is COMMITTED or ABORTED (what a transaction following it waits for)."""
        self._coordinators = coordinators
        self._timeout_s = timeout_s
        self._id: TxnId | None = None
        self._wire_id: tuple[int, int] | None = None
        """``_id`` as frames carry it, made once (every send and acknowledgment takes it)."""
        self._opened_at: str | None = None
        """The coordinator that opened it."""
        self.state = TransactionState.NEW
        self._starting = asyncio.Lock()
        self._registrations = Registrations(coordinators)
        """ADD_PARTITION / ADD_SUBSCRIPTION calls made (or in flight), so each happens once."""
        self._closed_by_client = False
        """Aborted by ``Client.close()``, not by the application."""
        self.span: tracing.Span | None = None
        """Tracing on: the transaction's span, from its start to its end; its NEW_TXN,
        sends, acks and END_TXN are its children (docs/tracing.md)."""
        self._placements = Placements() if one_step else None
        """Where its operations went, for the one-step commit (None: off)."""
        self.operations = Operations(
            self._placements, lambda: "(not started)" if self._id is None else str(self._id)
        )
        """Its sends and acknowledgments: producers and consumers report each one there."""

    @property
    def id(self) -> TxnId:
        """Its coordinator's id, from its start (its first send or acknowledgment, or
        ``start()``) on.

        Raises:
            ClientError: it has not started; or it ended (committed, aborted) with nothing
                sent or acknowledged in it, so no coordinator ever knew it (``state`` says
                how it ended).
        """
        if self._id is None and self.state in _ENDED:
            raise ClientError(
                f"the transaction (never started) is {self.state}: nothing was sent or "
                "acknowledged in it, so it has no id and no coordinator knows it "
                "(txn.state says how it ended)"
            )
        if self._id is None:
            raise ClientError(
                "the transaction has not started: it starts with its first send or "
                "acknowledgment (or call start())"
            )
        return self._id

    @property
    def wire_id(self) -> tuple[int, int]:
        """:attr:`id` as frames carry it (raises as :attr:`id` does)."""
        if self._wire_id is not None:
            return self._wire_id
        return (self.id.most, self.id.least)

    def _deadline(self, timeout_s: float | None) -> Deadline:
        return Deadline(self._coordinators.operation_timeout_s if timeout_s is None else timeout_s)

    async def start(self, protocol: str = "v5", *, timeout_s: float | None = None) -> Self:
        """NEW_TXN now, for a v5 transaction (scalable topics) or a v4 one (``persistent://``
        topics). Without it, the first send or acknowledgment starts the transaction with
        the protocol its topic's domain calls for. On an OPEN transaction it does nothing.

        Args:
            timeout_s: limit of the call (default: the client's operation timeout).

        Raises:
            ServerError: NotAllowed (no v4 here), InvalidArgument.
            Timeout: no coordinator answered in time (RETRIABLE).
            ClientError: the transaction has ended, or is ending (COMMITTED, ABORTED,
                COMMITTING): it cannot start again; ``client.transaction()`` makes a new one.
        """
        self._check_open(TransactionState.NEW)
        await self._start(protocol, self._deadline(timeout_s))
        return self

    async def _start(self, protocol: str, deadline: Deadline) -> None:
        """NEW_TXN once, by ``deadline``. An operation that arrives while another one
        starts the transaction waits for it only within its own limit; so does an end
        (``operations.joining``), and what opens after an end gave up waiting is aborted.
        Raises Timeout (RETRIABLE: nothing was done), ClientError (ended), or NEW_TXN's."""
        if self._id is None:
            with self.operations.joining():  # (waiting for another's start included)
                await self._after_settled(deadline)
                try:
                    async with deadline.timeout():
                        await self._starting.acquire()
                except TimeoutError as e:
                    raise Timeout(
                        f"the transaction was not started within {deadline} (another "
                        "operation is starting it); nothing was done",
                        category=ErrorCategory.RETRIABLE,
                    ) from e
                try:
                    if self._id is None:
                        await self._open(protocol, deadline)
                finally:
                    self._starting.release()

    async def _after_settled(self, deadline: Deadline) -> None:
        """A transaction that follows another starts once that one's sends and acks are
        done (held by its transaction): on an ordered subscription the broker refuses an
        acknowledgment in one transaction while an earlier message's is still on its way in
        another (``TransactionConflict``), as that one might abort while this one commits.

        Raises Timeout (RETRIABLE: nothing was done) when they are not done by
        ``deadline``."""
        after = self.after
        if after is not None and not await after.operations.settle(deadline):
            raise Timeout(
                f"the transaction was not started within {deadline}: the transaction it "
                f"follows ({after._id}) still has {len(after.operations.in_flight)} "
                "operations in flight; nothing was done",
                category=ErrorCategory.RETRIABLE,
            )

    async def _open(self, protocol: str, deadline: Deadline) -> None:
        self._check_open(TransactionState.NEW)  # (ended while it waited to start it)
        self.span = self.span or tracing.start(tracing.CLIENT, "transaction")
        opened = await self._traced(
            "new-txn", self._coordinators.open(protocol, self._timeout_s, deadline)
        )
        if self.state is not TransactionState.NEW:  # ended by an abort that stopped waiting:
            self._coordinators.abort_soon(opened)  # not left OPEN until its timeout
            self._span_ends()
            self._check_open()  # raises
        self._id, self._opened_at = opened.txn, opened.url
        self._wire_id = (opened.txn.most, opened.txn.least)
        self._move(TransactionState.OPEN)
        if self.span is not None:
            self.span.set_attribute("segtxn.txn.id", str(opened.txn))

    def _move(self, to: TransactionState) -> None:
        """Raises ClientError: ``to`` does not follow the state it is in (``NEXT``)."""
        if to is not self.state and to not in NEXT[self.state]:
            raise ClientError(f"transaction {self._id}: {self.state} cannot become {to}")
        self.state = to
        if not NEXT[to]:  # COMMITTED or ABORTED, for good
            self._ended.set()

    async def wait_ended(self, deadline: Deadline) -> bool:
        """Wait until it is COMMITTED or ABORTED, at most until ``deadline``; False if it is
        not by then (not yet committed or aborted, or its commit's outcome unknown)."""
        if self._ended.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            async with deadline.timeout():
                await self._ended.wait()
        return self._ended.is_set()

    def _check_open(self, *also: TransactionState) -> None:
        """Raises ClientError naming its state unless it is OPEN (or in ``also``):
        TransactionEnded once COMMITTED or ABORTED, ClientClosed once its client's close
        aborted it, so that what the application does with it next says why."""
        if self.state is not TransactionState.OPEN and self.state not in also:
            name = (
                "the transaction (never started)" if self._id is None else f"transaction {self._id}"
            )
            if self._closed_by_client:
                raise ClientClosed(f"{name} was aborted when its client closed")
            if self.state in _ENDED:
                raise TransactionEnded(f"{name} is {self.state}")
            raise ClientError(f"{name} is {self.state}")

    def check_not_ended(self) -> None:
        """For an operation that joined it and then waited (a send, for room in its
        producer's window, or to be written while its producer reconnects), before it goes
        out: an ``abort()`` stops waiting for its operations after half its limit and ends
        the transaction without them, and the broker would only refuse one that went out
        after.

        Raises:
            TransactionEnded: it is COMMITTED or ABORTED (ClientClosed: its client's close
                aborted it).
        """
        if self.state in _ENDED:
            self._check_open()

    @property
    def ended(self) -> bool:
        """COMMITTED or ABORTED: :meth:`check_not_ended` raises."""
        return self.state in _ENDED

    def joined(self, topic: str) -> bool:
        """Whether an operation on ``topic`` can go ahead with nothing to ask first: the
        transaction is OPEN and a v5 one, and ``topic`` is scalable (``topic://`` or
        ``segment://``), so :meth:`add_partition` and :meth:`add_subscription` would do
        nothing (see :meth:`_register`). Sends and acknowledgments check this before
        awaiting them: it is on every one's path. False: call them (they start the
        transaction, refuse a topic of the other protocol, or register a v4 one)."""
        return (
            self.state is TransactionState.OPEN
            and self._id is not None
            and self._id.is_v5
            and not topic.startswith("persistent://")
        )

    async def add_partition(self, topic: str, deadline: Deadline | None = None) -> None:
        """ADD_PARTITION_TO_TXN (once per topic): the coordinator checks the domain. Ends
        by ``deadline`` (the calling send's; default: the operation timeout)."""
        await self._register("partitions", topic, None, deadline)

    async def add_subscription(
        self, topic: str, subscription: str, deadline: Deadline | None = None
    ) -> None:
        """ADD_SUBSCRIPTION_TO_TXN (once per topic and subscription), by ``deadline``."""
        await self._register("subscriptions", topic, subscription, deadline)

    async def _register(
        self, command: str, topic: str, subscription: str | None, deadline: Deadline | None
    ) -> None:
        """Called for every send and ack in the transaction (cheap once registered).

        Raises ServerError, Timeout (RETRIABLE: the operation was not done; the
        registration may still complete for the next one), or TransactionEnded (ended,
        before the call or while it registered: an ``abort()`` stops waiting for its
        operations after half its limit; the broker would only refuse the operation)."""
        deadline = deadline or self._deadline(None)
        v4 = topic.startswith("persistent://")
        if self.state is TransactionState.NEW:
            await self._start("v4" if v4 else "v5", deadline)
        self._check_open()
        if v4 == self.id.is_v5:
            raise NotAllowed(
                f"{topic} cannot join {self.id}: a v{5 if self.id.is_v5 else 4} transaction "
                "spans only "
                + ("scalable (topic://) topics" if self.id.is_v5 else "persistent:// topics")
                + "; v4 and v5 never mix in one transaction",
            )
        if self.id.is_v5:
            # v5 participants record their own part (op records); the coordinator's ADD_*
            # is a no-op beyond the domain check just made, so it costs nothing to skip it
            # and a round trip on every transaction's first send and ack to make it.
            return
        with self.operations.joining():  # a commit meanwhile waits for it, then its send
            await self._registrations.register(self.id, command, topic, subscription, deadline)
            self.check_not_ended()  # an abort() that stopped waiting for it went on without it

    @property
    def placements(self) -> Placements | None:
        """Where its operations are placed (producers and consumer streams record each
        write there, resends included: :class:`~segtxn.client.onestep.Placements`); None
        when the one-step commit does not apply (off, or not a v5 transaction)."""
        if self._id is None or not self._id.is_v5:
            return None
        return self._placements

    @property
    def opening(self) -> bool:
        """NEW, and a send or ack (or ``start()``) is opening it now."""
        return self.state is TransactionState.NEW and bool(self.operations.in_flight)

    async def _traced(
        self,
        name: str,
        call: Awaitable[_T],
        attributes: dict[str, tracing.AttributeValue] | None = None,
    ) -> _T:
        """``call`` under a client span ``name``, a child of the transaction's (its HTTP
        request carries it to the coordinator or broker)."""
        return await tracing.call_in_span(
            tracing.CLIENT, name, call, parent=self.span, attributes=attributes
        )

    def _span_ends(self, error: BaseException | None = None) -> None:
        """The transaction ended (committed, aborted, or refused): so does its span."""
        if self.span is not None:
            self.span.set_attribute("segtxn.txn.outcome", self.state.value)
            tracing.end(self.span, error)
            self.span = None
