"""The v4 transaction coordinator (PIP-31): a transaction log, and END_TXN fanned out.

- Coordinator ids ``0..N-1`` are leases (leader election); the holder of id ``i`` owns the
  managed ledger ``__transaction_log_<i>``. Winning and taking them over is
  :mod:`segtxn.coordinator.v4ids`; this module is what a transaction goes through on the
  logs held. Every state change of a transaction appends its whole metadata (state,
  partitions, subscriptions, timeout) to that log; ``NEW_TXN`` returns once OPEN is
  durable, so ``least`` numbers are never reused.
- ``ADD_PARTITION_TO_TXN`` / ``ADD_SUBSCRIPTION_TO_TXN`` log the new participants.
- ``END_TXN`` logs COMMITTING (or ABORTING), sends ``END_TXN_ON_PARTITION`` to the home
  broker of every partition and ``END_TXN_ON_SUBSCRIPTION`` for every subscription (they
  write markers / apply pending acks), then logs COMMITTED (ABORTED). PIP-31's rules: the
  same END again succeeds (or resumes the fan-out); the opposite one fails with
  ``InvalidTxnStatus``; a commit after the deadline aborts.
- **Recovery**: the new holder of an id replays its log and finishes every transaction
  caught COMMITTING / ABORTING; the timeout sweep moves OPEN transactions past their
  deadline to TIME_OUT and aborts them; a client's END_TXN whose fan-out failed (a
  participant away, or refusing for now) answers the error, saying the decision is
  logged, and leaves it to the background too. Each goes on there until every
  participant took the decision (:meth:`CoordinatorV4._resume`).
- **The log stays bounded** (:mod:`segtxn.coordinator.txnlog`): once it has grown by
  ``v4_log_compact_entries`` it is compacted in the background; a transaction ended more
  than ``gc_retention_s`` ago is then forgotten (END_TXN or a status query about it gets
  ``TransactionNotFound``, as for a number never issued).
- A participant that cannot take its marker (a terminated topic) fails END_TXN at once
  with ``TopicTerminatedError``; the transaction stays COMMITTING (it cannot complete).

Calls for an id this process does not hold are forwarded to its holder (by the app).
The log lives in ``CoordinatorSettings.ledger_url`` (whoever takes an id over must reach
the same storage: one machine, or a shared volume), or, with ``replication``, on the
brokers' storage nodes, which any coordinator process reaches.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import aiohttp
import msgspec

from segtxn.coordinator import sweeps
from segtxn.coordinator.fanout import FINAL_REFUSALS, FIRST_RETRY_S, Participants
from segtxn.coordinator.retry import Retry
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.txnlog import (
    ABORTED,
    ABORTING,
    COMMITTED,
    COMMITTING,
    FINAL,
    OPEN,
    TIME_OUT,
    TxnMeta,
    open_storage,
)
from segtxn.coordinator.v4held import HeldLog
from segtxn.coordinator.v4ids import HeldLogs
from segtxn.ledger import LedgerError, LogStorage
from segtxn.ledger.replicas import ReplicatedLogStorage, widen_default_executor
from segtxn.metastore import MetadataStore
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import MAX_TXN_PARTICIPANTS
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnAction, TxnId, check_participants
from segtxn.stopping import Stopping
from segtxn.topics.catalog import Catalog
from segtxn.topics.nodes import CatalogNodes
from segtxn.topics.repairs import RepairLoop

log = logging.getLogger(__name__)

RESUME_RETRY_MAX_S = 2.0
"""The longest pause between tries to finish a decided transaction a participant delays."""


class CoordinatorV4:
    def __init__(
        self, store: MetadataStore, settings: CoordinatorSettings, storage: LogStorage | None = None
    ) -> None:
        self.store = store
        self.settings = settings
        self._catalog = Catalog(store)
        self._nodes: CatalogNodes | None = None
        if storage is None:
            storage, self._nodes = open_storage(
                settings.ledger_url,
                settings.replication,
                self._catalog,
                settings.auth.cluster_session,
            )
        self._storage = storage
        self._tasks: set[asyncio.Task[None]] = set()
        self._resuming: dict[tuple[int, int], HeldLog] = {}
        """The transactions (``TxnMeta.txn``) a :meth:`_resume` is finishing now, each with
        the log it runs on (a loop on a log lost, not yet ended, is not one on its
        successor here)."""
        self.counters = {
            "opened": 0,
            "committed": 0,
            "aborted": 0,
            "timeouts": 0,
            "replayed": 0,
            "log_compactions": 0,
            "log_compaction_failures": 0,
            "log_trimmed_ledgers": 0,
            "log_trimmed_entries": 0,
            "log_dropped_txns": 0,
        }
        self.ids = HeldLogs(
            store,
            settings,
            storage,
            self.counters,
            spawn=self._spawn,
            recovered=self._taken_over,
        )
        self.repairer: RepairLoop | None = None
        """With replication: keeps the closed ledgers of the logs held here copied."""
        if self._nodes is not None and settings.replication is not None:
            self.repairer = RepairLoop(
                self._catalog,
                self._nodes,
                write_quorum=settings.replication.write_quorum,
                settings=settings.repair,
                held=lambda: [h.log.ledger for h in self.held.values()],
                owner=f"coordinator {settings.advertise_url}",
            )
        self._http: aiohttp.ClientSession | None = None
        """Participant calls, and calls forwarded to the holder of another id."""
        self.participants: Participants | None = None
        """Where decisions go (from :meth:`start`)."""
        self._round_robin = itertools.count()

    @property
    def held(self) -> dict[int, HeldLog]:
        """The v4 ids this process holds now, each with its log (:class:`HeldLogs`)."""
        return self.ids.held

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if not self.settings.v4_coordinator_ids:
            return
        if isinstance(self._storage, ReplicatedLogStorage) and self._nodes is not None:
            widen_default_executor()
            await self._storage.start()
            await self._nodes.start()
        await self.ids.live_session()
        # participants and other coordinators are called as the cluster role
        self._http = self.settings.auth.cluster_session()
        self.participants = Participants(self._catalog, self._http, self.settings.fan_out_timeout_s)
        self.ids.campaign()
        sweep = sweeps.every("v4 timeout sweep", self.settings.timeout_sweep_s, self.sweep_timeouts)
        self._spawn(sweep, "v4-timeout-sweep")  # (a failed round does not end it)
        if self.repairer is not None:
            self._spawn(self.repairer.run(), "v4-log-repair")

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _taken_over(self, held: HeldLog) -> None:
        """A log just taken over: its stop gives the id up (:meth:`_give_up`), and what its
        replay caught mid-way is finished (:meth:`_finish_caught`)."""
        held.log.ledger.watch_write_failure(lambda _: self._give_up(held))
        self._finish_caught(held)

    def _give_up(self, held: HeldLog) -> None:
        """``held``'s log refuses every write until it is opened again (its writer stopped:
        a failed append, or a fence its compaction met in the background): give the id up,
        once, so that a take-over (here or elsewhere) reopens and replays it. Told by the
        stop itself, not only by the next append refused: a compaction's fence left the id
        here, answering from memory for a log it could no longer write, until some call
        appended and was refused."""
        if not held.giving_up:
            held.giving_up = True
            self._spawn(held.give_up(), f"v4-give-up-{held.log.ledger.name}")

    def _finish_caught(self, held: HeldLog) -> None:
        """Finish, in the background, every transaction the replay of a log taken over
        caught mid-way (COMMITTING, ABORTING, TIME_OUT)."""
        for meta in held.txns.values():
            if meta.state in (COMMITTING, ABORTING, TIME_OUT):
                action = TxnAction.COMMIT if meta.state == COMMITTING else TxnAction.ABORT
                self._start_resume(held, meta, action)

    async def stop(self, stopping: Stopping | None = None) -> None:
        """Resign every id won, held or being taken over (another coordinator can take it
        at once: :meth:`HeldLogs.stop`), close the logs held, the HTTP sessions and the
        store session: each step whatever the ones before it raised, a failure logged at
        WARNING, all within ``stopping``'s time (:mod:`segtxn.stopping`; default: a stop of
        its own). Never raises but a cancellation."""
        stopping = stopping or Stopping("v4 coordinator")
        await stopping.cancel("its v4 tasks", list(self._tasks))
        await self.ids.stop(stopping)
        if self._nodes is not None:
            await stopping.step("closing its storage nodes' HTTP session", self._nodes.close())
        if self._http is not None:
            await stopping.step("closing its HTTP session", self._http.close())
        await self.ids.close_session(stopping)

    # ------------------------------------------------------------------ ownership

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise ServerError(ErrorName.NOT_ALLOWED, "v4 transactions are not enabled here")
        return self._http

    def holds(self, txn: TxnId) -> bool:
        return txn.most in self.held

    async def holder_url(self, txn: TxnId) -> str:
        """Where the holder of ``txn``'s coordinator id listens (:meth:`HeldLogs.holder_url`).

        Raises ServerError(TransactionNotFound / ServiceNotReady)."""
        return await self.ids.holder_url(txn)

    def _held(self, txn: TxnId) -> HeldLog:
        held = self.held.get(txn.most)
        if held is None:
            raise ServerError(ErrorName.SERVICE_NOT_READY, f"v4 coordinator {txn.most} moved")
        return held

    def _meta(self, txn: TxnId) -> tuple[HeldLog, TxnMeta]:
        held = self._held(txn)
        meta = held.txns.get(txn.least)
        if meta is None:
            issued = txn.least < held.log.next_least
            why = " (ended and forgotten, or never issued)" if issued else ""
            raise ServerError(ErrorName.TRANSACTION_NOT_FOUND, f"no transaction {txn}{why}")
        return held, meta

    async def _log(self, held: HeldLog, meta: TxnMeta) -> TxnMeta:
        """Append ``meta`` to the log (it is then the transaction's state); start a
        compaction in the background once the log has grown enough."""
        try:
            await held.log.append(meta)
        except LedgerError as e:
            self._give_up(held)
            raise ServerError(ErrorName.SERVICE_NOT_READY, f"transaction log: {e}") from e
        if held.log.due:
            self._spawn(held.compact(), f"v4-log-compaction-{meta.txn[0]}")
        return meta

    # ------------------------------------------------------------------ commands

    async def new_txn(
        self, timeout_s: float | None = None, owner: str | None = None
    ) -> tuple[TxnId, TxnMeta]:
        """Open a transaction on one of the ids held here, logging ``owner`` (the role that
        opens it, with security on) with it."""
        timeout = self.settings.default_timeout_s if timeout_s is None else timeout_s
        if not 0 < timeout <= self.settings.max_timeout_s:
            raise ServerError(
                ErrorName.INVALID_ARGUMENT,
                f"timeout must be in (0, {self.settings.max_timeout_s}] seconds, not {timeout}",
            )
        ids = sorted(self.held)
        if not ids:
            raise ServerError(ErrorName.SERVICE_NOT_READY, "this coordinator holds no v4 id")
        coordinator_id = ids[next(self._round_robin) % len(ids)]
        held = self.held[coordinator_id]
        least = held.log.take_least()
        now = int(time.time() * 1000)
        meta = TxnMeta((coordinator_id, least), OPEN, now + int(timeout * 1000), now, owner=owner)
        await self._log(held, meta)
        self.counters["opened"] += 1
        log.debug("txn %s: opened (timeout %g s)", TxnId(coordinator_id, least), timeout)
        return TxnId(coordinator_id, least), meta

    async def add_participants(
        self, txn: TxnId, partitions: list[str], subscriptions: list[tuple[str, str]]
    ) -> None:
        """Log new participants. A topic that does not exist is refused: its commit could
        never reach it (a client's producer or consumer creates its topic before it sends
        or acknowledges anything).

        Raises:
            ServerError(NotAllowed / TopicNotFound / TransactionNotFound / InvalidTxnStatus)
        """
        check_participants([*partitions, *(t for t, _ in subscriptions)], v5=False)
        held, _ = self._meta(txn)
        async with held.locks.setdefault(txn.least, asyncio.Lock()):
            _, meta = self._meta(txn)
            if meta.state != OPEN:
                raise ServerError(ErrorName.INVALID_TXN_STATUS, f"{txn} is {meta.state}")
            new_partitions = list(dict.fromkeys(p for p in partitions if p not in meta.partitions))
            new_subs = list(dict.fromkeys(s for s in subscriptions if s not in meta.subscriptions))
            total = len(meta.partitions) + len(meta.subscriptions) + len(new_partitions)
            if total + len(new_subs) > MAX_TXN_PARTICIPANTS:
                raise ServerError(
                    ErrorName.INVALID_ARGUMENT,
                    f"{txn}: at most {MAX_TXN_PARTICIPANTS} partitions and subscriptions "
                    "in one transaction",
                )
            for topic in dict.fromkeys([*new_partitions, *(t for t, _ in new_subs)]):
                if await self._catalog.get(TopicName.parse(topic)) is None:
                    raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
            if new_partitions or new_subs:
                await self._log(
                    held,
                    msgspec.structs.replace(
                        meta,
                        partitions=[*meta.partitions, *new_partitions],
                        subscriptions=[*meta.subscriptions, *new_subs],
                    ),
                )

    def status(self, txn: TxnId) -> TxnMeta:
        return self._meta(txn)[1]

    async def end_txn(self, txn: TxnId, action: TxnAction) -> TxnMeta:
        """Log the decision, fan it out, log the final state.

        Raises:
            ServerError(TransactionNotFound / InvalidTxnStatus): nothing was logged.
            ServerError(TopicTerminatedError / InvalidTxnStatus / ...): a participant
                refused the decision for good (:data:`FINAL_REFUSALS`); it stays
                COMMITTING / ABORTING.
            ServerError(ServiceNotReady / PersistenceError / ...): a participant did not
                take it in ``fan_out_timeout_s``, or refused it for now; the decision is
                logged and the coordinator goes on applying it in the background (the
                message says so: :meth:`_pending`). END_TXN may be repeated."""
        held, meta = self._meta(txn)
        wanted = COMMITTED if action is TxnAction.COMMIT else ABORTED
        going = COMMITTING if action is TxnAction.COMMIT else ABORTING
        late = False
        async with held.locks.setdefault(txn.least, asyncio.Lock()):
            _, meta = self._meta(txn)
            if meta.state in FINAL:
                if meta.state == wanted:
                    return meta
                log.info("txn %s: %s refused, already %s", txn, action.value, meta.state)
                raise ServerError(
                    ErrorName.INVALID_TXN_STATUS, f"{txn} is already {meta.state}; cannot {action}"
                )
            if meta.state == OPEN:
                late = action is TxnAction.COMMIT and time.time() * 1000 > meta.timeout_ms
                if late:
                    action, going = TxnAction.ABORT, ABORTING
                meta = await self._log(held, msgspec.structs.replace(meta, state=going))
            elif (meta.state == COMMITTING) != (action is TxnAction.COMMIT):
                raise ServerError(
                    ErrorName.INVALID_TXN_STATUS, f"{txn} is {meta.state}; cannot {action}"
                )
        try:
            final = await self._finish(held, meta, action)
        except Exception as e:
            raise self._pending(held, meta, action, e) from e
        if late:
            log.info(
                "txn %s: COMMIT came past its timeout of %.1f s: aborted instead",
                txn,
                (meta.timeout_ms - meta.created_ms) / 1000,
            )
            raise ServerError(
                ErrorName.INVALID_TXN_STATUS, f"{txn} timed out before the commit: aborted"
            )
        return final

    def _pending(self, held: HeldLog, meta: TxnMeta, action: TxnAction, e: Exception) -> Exception:
        """What a client's END_TXN whose fan-out failed with ``e`` answers, once the
        coordinator goes on with it: the decision is logged, so unless ``e`` is a refusal no
        try can change (:data:`~segtxn.coordinator.fanout.FINAL_REFUSALS`) :meth:`_resume`
        finishes it in the background (one loop per transaction: :meth:`_start_resume`),
        and the answer keeps ``e``'s name (a client branches on it) with a message that
        says the decision stands and is being applied. (Nothing went on: the transaction
        stayed COMMITTING / ABORTING until the client asked again or a take-over.)"""
        if isinstance(e, ServerError) and e.name in FINAL_REFUSALS:
            return e
        self._start_resume(held, meta, action)
        if not isinstance(e, ServerError):
            return e  # (the store's, a bug: the boundary answers it)
        return ServerError(
            e.name,
            f"{TxnId(*meta.txn)} is {meta.state}: the {action} is logged and the coordinator "
            f"goes on applying it; {e.message}",
        )  # (never a participant's redirect: the client would follow it to a broker)

    def _start_resume(self, held: HeldLog, meta: TxnMeta, action: TxnAction) -> None:
        """Start :meth:`_resume` for ``meta``'s transaction unless one runs for it already
        (a client asking again, recovery, the sweep: one loop, not one each)."""
        if self._resuming.get(meta.txn) is held:
            return
        self._resuming[meta.txn] = held
        self._spawn(self._resume(held, meta, action), f"v4-finish-{meta.txn[1]:x}")

    async def _finish(self, held: HeldLog, meta: TxnMeta, action: TxnAction) -> TxnMeta:
        """Fan the decision out, then log the final state (safe to run twice)."""
        txn = TxnId(*meta.txn)
        assert self.participants is not None  # a log is held only once started
        await self.participants.end(txn, meta.partitions, meta.subscriptions, action)
        async with held.locks.setdefault(txn.least, asyncio.Lock()):
            current = held.txns.get(txn.least, meta)
            if current.state in FINAL:
                return current
            final = msgspec.structs.replace(
                current,
                state=COMMITTED if action is TxnAction.COMMIT else ABORTED,
                finalized_ms=int(time.time() * 1000),
            )
            await self._log(held, final)
            held.locks.pop(txn.least, None)
        self.counters["committed" if action is TxnAction.COMMIT else "aborted"] += 1
        log.debug("txn %s: %s (%d partitions, %d subscriptions)", txn, final.state,
                  len(final.partitions), len(final.subscriptions))  # fmt: skip
        return final

    async def _resume(self, held: HeldLog, meta: TxnMeta, action: TxnAction) -> None:
        """Finish a decided transaction in the background (recovery, timeouts, a client's
        END_TXN whose fan-out failed; one loop per transaction: :meth:`_start_resume`): the
        decision is logged, so it must reach every participant, and nothing else tries
        again while this coordinator holds the id (only a client's repeated END_TXN, or a
        take-over). So every failure is tried again (:mod:`segtxn.coordinator.retry`: the
        first a WARNING, then at most one a minute, the others at DEBUG, a bug's at ERROR
        with its traceback; the pause doubling up to ``RESUME_RETRY_MAX_S``; an INFO line
        once it went through): a participant away (``ServiceNotReady``) or in trouble of its own
        (``PersistenceError``: a cursor record to repair, a damaged ledger file, which an
        operator's repair or a store coming back cures), the store failing a look-up.
        Only a refusal no try can change (:data:`~segtxn.coordinator.fanout.FINAL_REFUSALS`:
        a terminated topic, the transaction already ended the other way there) ends it,
        logged at WARNING: the transaction stays COMMITTING or ABORTING (TIME_OUT) for good.
        It ends too once the transaction is final (a client's END_TXN asked again finished
        it) or the id is lost. (It gave up at a PersistenceError: the decision never reached
        that participant.)"""
        try:
            await self._resume_until_done(held, meta, action)
        finally:
            if self._resuming.get(meta.txn) is held:
                del self._resuming[meta.txn]

    async def _resume_until_done(self, held: HeldLog, meta: TxnMeta, action: TxnAction) -> None:
        """:meth:`_resume`'s loop; it ends too once the transaction is final (a client's
        END_TXN asked again finished it) or forgotten."""
        txn = TxnId(*meta.txn)
        retry = Retry(
            f"txn {txn}: finishing its {action!s}", FIRST_RETRY_S, expected_max_s=RESUME_RETRY_MAX_S
        )
        while not held.leadership.lost.is_set():
            current = held.txns.get(txn.least)
            if current is None or current.state in FINAL:
                retry.reset()  # (a client's END_TXN went through)
                return
            try:
                await self._finish(held, meta, action)
                retry.reset()
                return
            except ServerError as e:
                if e.name in FINAL_REFUSALS:
                    log.warning(
                        "txn %s: finishing its %s refused for good: %s; it stays %s",
                        txn, action, e, meta.state,
                    )  # fmt: skip
                    return
                await retry.after(e)  # a participant away or in trouble: back off, then again
            except Exception as e:
                await retry.after(e)

    # ------------------------------------------------------------------ timeouts

    async def sweep_timeouts(self) -> int:
        """TIME_OUT (logged), then abort, every OPEN transaction past its deadline."""
        now = time.time() * 1000
        timed_out = 0
        for held in list(self.held.values()):
            for meta in [m for m in held.txns.values() if m.state == OPEN and m.timeout_ms < now]:
                async with held.locks.setdefault(meta.txn[1], asyncio.Lock()):
                    current = held.txns.get(meta.txn[1])  # (gone: ended, then compacted)
                    if current is None or current.state != OPEN:
                        continue
                    current = await self._log(
                        held, msgspec.structs.replace(current, state=TIME_OUT)
                    )
                timed_out += 1
                self.counters["timeouts"] += 1
                log.info(
                    "txn %s: timed out, aborting: TIME_OUT logged by the sweep (age %.1f s, "
                    "timeout %.1f s)",
                    TxnId(*current.txn),
                    (now - current.created_ms) / 1000,
                    (current.timeout_ms - current.created_ms) / 1000,
                )
                self._start_resume(held, current, TxnAction.ABORT)
        return timed_out
