"""Publishing on one topic or segment: de-duplication, producer order, the ledger append.

A send is stored at most once per (producer name, sequence id) (segtxn/broker/dedup.py), in
its producer's send order (segtxn/broker/ordering.py), as one ledger entry; a transactional
send goes through the topic's transaction buffer, a plain one straight to the ledger.

Two ways in, with the same outcome per send:

- :meth:`Publishing.publish`: one send, in its own task (the broker's default; a
  transactional send may wait on the store, and the sends of a producer do not wait for each
  other's waits);
- :meth:`Publishing.publish_plain`: plain sends that arrived together (a ``send_batch``), in
  one task: each is queued in its turn, then their writes are awaited together. A task per
  message, its wake-ups and its bookkeeping were the largest share of a producing broker's
  scheduling work (py-spy of bench/broker.py);
- :meth:`Publishing.publish_txn`: sends of one transaction that arrived together, in one
  task: the transaction buffer checks the header once, queues each in its turn and records
  them all with one rewrite. A task each made a batch of a hundred wait for a hundred
  turn hand-overs, one per turn of the event loop (bench/peer.py's transactional rows).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass

from segtxn.aio import SETTLE_S, settle
from segtxn.broker.arguments import check_send
from segtxn.broker.dedup import Deduplication, ProducerState
from segtxn.broker.dedup_snapshots import SnapshotFenced
from segtxn.broker.entry import StoredMessage, encode_entry
from segtxn.broker.ordering import Turn
from segtxn.broker.txn.buffer import MetadataTransactionBuffer
from segtxn.broker.txn.visibility import TransactionBuffer
from segtxn.failures import translate
from segtxn.ledger import LedgerError, LedgerSealed, ManagedLedger, Position
from segtxn.metastore import MetadataStoreError
from segtxn.protocol import txnops
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import Send
from segtxn.protocol.names import Domain, TopicName
from segtxn.protocol.txn import TxnId

log = logging.getLogger(__name__)

Outcome = tuple[Position, bool]
"""(position, duplicate) of a send."""


@dataclass
class TopicCounters:
    messages_in: int = 0
    bytes_in: int = 0
    duplicates: int = 0


@dataclass
class _Fresh:
    """A send to store: its producer's state, the future resends of it wait on, its entry."""

    state: ProducerState
    original: asyncio.Future[Position]
    entry: bytes
    txn: TxnId | None


class Publishing:
    def __init__(
        self,
        name: TopicName,
        ledger: ManagedLedger,
        dedup: Deduplication,
        buffer: TransactionBuffer,
        max_message_bytes: int,
    ) -> None:
        self.name = name
        self.ledger = ledger
        self.dedup = dedup
        self.buffer = buffer
        self._max_message_bytes = max_message_bytes
        self.counters = TopicCounters()
        self._snapshotting: asyncio.Task[None] | None = None

    def turn(self, producer: str) -> Turn:
        """The next turn of ``producer``'s sends: take one per send, in the order the sends
        arrive, and hand it to :meth:`publish` or :meth:`publish_plain`."""
        return self.dedup.state(producer).order.take()

    async def publish(self, producer: str, send: Send, turn: Turn) -> Outcome:
        """Store one message unless it is a duplicate; returns (position, duplicate).

        The message is queued on the ledger only after every earlier send of ``producer``
        (earlier turns, this connection's or a previous one's) has queued its own or given
        up, so a producer's messages are stored in the order they were sent, transactional
        or not. The turn is released however this ends.

        Raises:
            ServerError(MessageTooLarge / TopicTerminatedError / PersistenceError, and the
                transaction buffer's errors for a transactional send)
        """
        try:
            if send.txn is not None:  # the transaction buffer's path (publish_txn)
                (outcome,) = await self.publish_txn(producer, [(send, turn)])
                if isinstance(outcome, ServerError):
                    raise outcome
                return outcome
            admitted = self._admit(producer, send, turn)
            if not isinstance(admitted, _Fresh):
                return await self._duplicate(admitted)
            try:
                position = await (await self._enqueue(send, admitted, turn))
            except BaseException as e:
                refusal = self._not_stored(send, admitted, e)
                if refusal is e or not isinstance(e, Exception):
                    raise  # a refusal already, or cancelled (never swallowed)
                raise refusal from e
            return self._stored(producer, send, admitted, position)
        finally:
            turn.release()

    async def publish_plain(
        self, producer: str, sends: list[tuple[Send, Turn]]
    ) -> list[Outcome | ServerError]:
        """Store plain sends of ``producer`` (each with its turn, taken in arrival order), as
        :meth:`publish` would one by one; returns each one's outcome or refusal, in order.
        Every turn is released however this ends."""
        # every send is taken in at once, as its own task would have been (a resend of one
        # on another connection waits for it); then each is queued in its turn
        if any(send.txn is not None for send, _ in sends):
            raise ValueError("publish_plain takes plain sends only")
        queued: list[_Fresh | Outcome | asyncio.Future[Position] | ServerError] = []
        for send, turn in sends:
            try:
                queued.append(self._admit(producer, send, turn))
            except ServerError as e:
                queued.append(e)
                turn.release()
        written: dict[int, asyncio.Future[Position]] = {}  # index -> its write
        reached = 0
        try:
            for (send, turn), item in zip(sends, queued, strict=True):
                if isinstance(item, _Fresh):
                    try:
                        write = self._enqueue_now(send, item, turn)  # (most: no wait)
                        if write is None:
                            write = await self._enqueue(send, item, turn)
                        written[reached] = write
                    except ServerError as e:
                        queued[reached] = e
                turn.release()
                reached += 1
            if written:  # one wake-up for all of them; a cancel here leaves the writes alone
                await asyncio.wait(written.values())
        except BaseException:
            for index, write in written.items():  # the rest follows each write by itself
                item = queued[index]
                assert isinstance(item, _Fresh)
                write.add_done_callback(
                    functools.partial(self._written, producer, sends[index][0], item)
                )
            raise
        finally:
            for (send, turn), item in zip(sends[reached:], queued[reached:], strict=True):
                turn.release()
                if isinstance(item, _Fresh):  # cancelled before its turn: given up
                    self._not_stored(send, item, asyncio.CancelledError())
        outcomes: list[Outcome | ServerError] = []
        for index, ((send, _), item) in enumerate(zip(sends, queued, strict=True)):
            if isinstance(item, ServerError):
                outcomes.append(item)
            elif isinstance(item, _Fresh):
                outcomes.append(self._written(producer, send, item, written[index]))
            else:
                try:
                    outcomes.append(await self._duplicate(item))
                except ServerError as e:
                    outcomes.append(e)
        return outcomes

    async def publish_txn(
        self, producer: str, sends: list[tuple[Send, Turn]]
    ) -> list[Outcome | ServerError]:
        """Store transactional sends of ``producer`` that arrived together, all in one
        transaction (each with its turn, taken in arrival order), as :meth:`publish` would
        one by one: the transaction buffer checks the header once and records them with one
        rewrite (``append_together``). Returns each one's outcome or refusal, in order.
        Every turn is released however this ends.

        A cancel once some are queued lets those be stored (or refused) first and their
        resends see it (a duplicate, not a second copy), then is raised."""
        if len({send.txn for send, _ in sends}) != 1 or sends[0][0].txn is None:
            raise ValueError("publish_txn takes the sends of one transaction")
        admitted: list[_Fresh | Outcome | asyncio.Future[Position] | ServerError] = []
        for send, turn in sends:
            try:
                admitted.append(self._admit(producer, send, turn))
            except ServerError as e:
                admitted.append(e)
            if not isinstance(admitted[-1], _Fresh):
                turn.release()  # nothing to append: later sends need not wait for it
        fresh = [(i, item) for i, item in enumerate(admitted) if isinstance(item, _Fresh)]
        settled: dict[int, Outcome | ServerError] = {}
        if fresh:
            txn = fresh[0][1].txn
            assert txn is not None
            try:  # the buffer releases every turn, however it ends
                results = await self.buffer.append_together(
                    txn,
                    [(item.entry, sends[i][1]) for i, item in fresh],
                    ops=[
                        txnops.send_op(str(self.name), producer, sends[i][0].seq) for i, _ in fresh
                    ],
                )
            except BaseException as e:
                refusals = [self._not_stored(sends[i][0], item, e) for i, item in fresh]
                if not isinstance(e, Exception):
                    raise  # cancelled (never swallowed); resends were told
                results = list(refusals)
            for (i, one), result in zip(fresh, results, strict=True):
                send = sends[i][0]
                if isinstance(result, Position):
                    settled[i] = self._stored(producer, send, one, result)
                else:
                    settled[i] = self._not_stored(send, one, result)
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError  # the buffer waited for what it had queued
        outcomes: list[Outcome | ServerError] = []
        for i, item in enumerate(admitted):
            if isinstance(item, ServerError):
                outcomes.append(item)
            elif isinstance(item, _Fresh):
                outcomes.append(settled[i])
            else:
                try:
                    outcomes.append(await self._duplicate(item))
                except ServerError as e:
                    outcomes.append(e)
        return outcomes

    async def _enqueue(self, send: Send, fresh: _Fresh, turn: Turn) -> asyncio.Future[Position]:
        """Queue a plain send's entry in its turn; returns its write (done once durable).

        Raises:
            ServerError: it could not be queued (sealed topic, failed ledger). A cancel
                is raised as it is, once the send has been given up (nothing in flight).
        """
        try:
            return await turn.enqueue(self.ledger, fresh.entry)
        except BaseException as e:
            refusal = self._not_stored(send, fresh, e)
            if refusal is e or not isinstance(e, Exception):
                raise  # a refusal already, or cancelled (never swallowed)
            raise refusal from e

    def _enqueue_now(
        self, send: Send, fresh: _Fresh, turn: Turn
    ) -> asyncio.Future[Position] | None:
        """:meth:`_enqueue` where that needs no wait (:meth:`Turn.enqueue_now`); None: it
        would wait, and nothing was queued."""
        try:
            return turn.enqueue_now(self.ledger, fresh.entry)
        except Exception as e:
            refusal = self._not_stored(send, fresh, e)
            if refusal is e:
                raise
            raise refusal from e

    def _written(
        self, producer: str, send: Send, fresh: _Fresh, written: asyncio.Future[Position]
    ) -> Outcome | ServerError:
        """Settle a plain send whose write is done (in the publisher, or, when the publisher
        was cancelled after queueing it, from the write itself: a resend must neither wait
        for ever nor store the message again)."""
        if written.cancelled():
            return self._not_stored(send, fresh, LedgerError("the write was cancelled"))
        if (error := written.exception()) is not None:
            return self._not_stored(send, fresh, error)
        return self._stored(producer, send, fresh, written.result())

    def _admit(
        self, producer: str, send: Send, turn: Turn
    ) -> _Fresh | Outcome | asyncio.Future[Position]:
        """De-duplication: a send to store (registered as in flight), the known outcome of
        a duplicate, or the future of its original still in flight.

        A seq not in flight, above the highest stored and below one still in flight is
        refused (ServiceNotReady: nothing was stored; a new send goes after the others). It
        was never stored (stored, it would not be above the highest stored), and stored now
        it would follow a later send of its producer: docs/protocol.md promises a gap,
        never an inversion. That is the resend of a send whose refusal was lost with its
        connection while later sends were still being written (the original's fate, given
        again), or a producer that numbers its sends out of order. Once they have all
        failed, it is stored (nothing after it is).

        A seq not above the highest stored is a duplicate (its original's id, or
        ``-1:-1`` where unknown) only if it may have been stored: one the broker knows was
        never stored (:meth:`ProducerState.never_stored`: its refusal was lost with its
        connection while later sends were stored) is refused again, with the refusal it
        got while the topic stays loaded (:meth:`_never_stored` after a reload). Answered
        as a duplicate, as Pulsar does, its producer took it for stored: a message lost
        though its application was told it was durable.

        Raises:
            ServerError: the send is refused (too large, a transaction of the wrong kind,
                a resend of a transactional message that was never recorded, a seq below
                one in flight, the resend of a send that was not stored).
        """
        check_send(send, self._max_message_bytes)
        txn = self._txn_of(send)  # (the same refusal for a resend)
        state = self.dedup.state(producer)
        in_flight = state.in_flight.get(send.seq)
        if in_flight is not None:
            self.counters.duplicates += 1
            turn.release()  # nothing to store: later sends need not wait for the original
            return in_flight
        if send.seq <= state.last:
            known = state.recent.get(send.seq)
            if known is None and state.never_stored(send.seq):
                raise state.refusals.get(send.seq) or self._never_stored(producer, send, state)
            self.counters.duplicates += 1
            if (
                known is not None
                and send.txn is not None
                and not self.buffer.visible(TxnId(*send.txn), known)
                and self._is_orphan(known)
            ):
                raise ServerError(
                    ErrorName.TRANSACTION_CONFLICT,
                    f"the first attempt of {producer}/{send.seq} was never recorded in its "
                    "transaction",
                )
            return (known if known is not None else Position(-1, -1)), True
        if (later := state.overtaken_by(send.seq)) is not None:
            raise ServerError(
                ErrorName.SERVICE_NOT_READY,
                f"{producer}/{send.seq} was not stored: {producer}/{later} is being written, "
                "and a producer's messages are stored in the order of their sequence ids",
            )
        original: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        state.take_in(send.seq, original, self.ledger.last_confirmed)
        entry = encode_entry(
            StoredMessage(
                producer_name=producer,
                sequence_id=send.seq,
                publish_time_ms=int(time.time() * 1000),
                payload=send.payload,
                key=send.key,
                properties=send.properties,
                event_time_ms=send.event_time_ms,
                txn=send.txn,
                producer_use=state.use,
            )
        )
        return _Fresh(state, original, entry, txn)

    @staticmethod
    async def _duplicate(admitted: Outcome | asyncio.Future[Position]) -> Outcome:
        if isinstance(admitted, tuple):
            return admitted
        return await asyncio.shield(admitted), True  # the original's outcome, when it has one

    def _not_stored(self, send: Send, fresh: _Fresh, error: BaseException) -> ServerError:
        """The refusal for a send whose append (or record) failed with ``error`` (or was
        cancelled: the broker is stopping); resends waiting on the original get the same
        refusal, and the next resend is admitted afresh."""
        fresh.state.in_flight.pop(send.seq, None)
        if isinstance(error, LedgerSealed):
            refusal = ServerError(ErrorName.TOPIC_TERMINATED, f"{self.name} is sealed")
        elif isinstance(error, ServerError):
            refusal = error
        elif isinstance(error, Exception) and (wire := translate(error)) is not None:
            refusal = wire  # the store is out or full, or the data is damaged: named so
        elif isinstance(error, LedgerError) and error.retriable:  # too few replicas, fenced
            refusal = ServerError(
                ErrorName.SERVICE_NOT_READY, f"{self.name} could not store the message: {error}"
            )
        elif isinstance(error, Exception):
            refusal = ServerError(ErrorName.PERSISTENCE, f"could not store the message: {error}")
        else:
            refusal = ServerError(ErrorName.SERVICE_NOT_READY, "stopped before it was stored")
        if not fresh.original.done():
            fresh.original.set_exception(refusal)
            fresh.original.exception()  # retrieved: a resend waiting on it sees it
        fresh.state.refused(send.seq, refusal)
        return refusal

    @staticmethod
    def _never_stored(producer: str, send: Send, state: ProducerState) -> ServerError:
        """The refusal for the resend of a send that was never stored and whose own
        refusal is not remembered (the topic was loaded again since): abortable in a
        transaction (it cannot commit without the message), else retriable (the message
        may be sent again, as a new one)."""
        what = f"{producer}/{send.seq} was not stored (refused, or never received)"
        after = f"{producer}/{state.last} is stored after it"
        if send.txn is not None:
            return ServerError(
                ErrorName.TRANSACTION_CONFLICT,
                f"{what}; {after}: its transaction {TxnId(*send.txn)} cannot have it",
            )
        return ServerError(
            ErrorName.SERVICE_NOT_READY, f"{what}; {after}: send it again as a new message"
        )

    def _stored(self, producer: str, send: Send, fresh: _Fresh, position: Position) -> Outcome:
        fresh.state.in_flight.pop(send.seq, None)
        fresh.original.set_result(position)
        self.counters.messages_in += 1
        self.counters.bytes_in += len(send.payload)
        if self.dedup.note_stored(producer, send.seq, position) and self._snapshotting is None:
            self._snapshotting = asyncio.create_task(
                self._snapshot(), name=f"dedup-snapshot-{self.name}"
            )
        return position, False

    def _txn_of(self, send: Send) -> TxnId | None:
        if send.txn is None:
            return None
        txn = TxnId(*send.txn)
        if txn.is_v5 != (self.name.domain is Domain.SEGMENT):
            raise ServerError(
                ErrorName.NOT_ALLOWED,
                f"{self.name}: v5 transactions write to scalable topics (segment://) and v4 "
                "ones to persistent:// topics; they never mix",
            )
        return txn

    def _is_orphan(self, position: Position) -> bool:
        return isinstance(self.buffer, MetadataTransactionBuffer) and self.buffer.is_orphan(
            position
        )

    async def _snapshot(self) -> None:
        try:
            await self.dedup.snapshot()
        except (SnapshotFenced, LedgerError, MetadataStoreError) as e:  # away, or not its own
            log.warning(
                "%s: de-duplication snapshot not written (replay will cover it): %s: %s",
                self.name, type(e).__name__, e,
            )  # fmt: skip
        except Exception:
            log.exception("%s: de-duplication snapshot failed (replay will cover it)", self.name)
        finally:
            self._snapshotting = None

    async def settle(self) -> None:
        """Wait for a de-duplication snapshot in progress (before closing or deleting),
        :data:`~segtxn.aio.SETTLE_S` at most: past it, it is cancelled (a reload replays
        from the last one written). Awaited without a bound, a snapshot whose write the
        store never answered held the topic's close, and a broker's stop, for ever."""
        if self._snapshotting is not None and not await settle(self._snapshotting, SETTLE_S):
            log.warning(
                "%s: de-duplication snapshot not written within %.0f s; cancelled (a reload "
                "replays from the last one written)", self.name, SETTLE_S,
            )  # fmt: skip
