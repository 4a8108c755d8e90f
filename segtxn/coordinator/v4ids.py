"""The v4 coordinator ids one process holds, each with its transaction log: their take-over.

Coordinator ids ``0..N-1`` are leases (leader election, on one store session for them all,
opened again once it expired); the holder of id ``i`` owns the managed ledger
``__transaction_log_<i>``. Taking an id over is winning its election, then recovering its log
(opened and replayed); the transactions the replay caught mid-way are handed to the
coordinator to finish (:class:`~segtxn.coordinator.v4.CoordinatorV4`). Calls for an id held
elsewhere are forwarded to its holder, found here (:meth:`HeldLogs.holder_url`).

Apart from :mod:`segtxn.coordinator.v4` (what a transaction goes through on a log held) as
v5's ids are (:mod:`segtxn.coordinator.v5ids`): winning, keeping and letting go of an id
meets failures of its own (a take-over that fails lets the id go before trying again; a
letting go that fails too keeps the leadership for the next take-over), which the state
machine over the logs need not know.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from segtxn.coordinator.retry import Retry, log_step_failure
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.txnlog import ABORTING, COMMITTING, TIME_OUT, TxnLog, log_name
from segtxn.coordinator.v4held import HeldLog
from segtxn.ledger import LogStorage
from segtxn.metastore import LeaderElection, Leadership, MetadataStore, MetadataStoreError, Session
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnId
from segtxn.stopping import Stopping
from segtxn.topics.transactions import V4_COORDINATOR_ELECTION

log = logging.getLogger(__name__)

ELECTION_PREFIX = V4_COORDINATOR_ELECTION

Spawn = Callable[[Coroutine[Any, Any, None], str], None]
"""Runs a coroutine in a task of the coordinator's (its stop cancels them all)."""


class HeldLogs:
    """Campaigns for the v4 ids ``0 .. settings.v4_coordinator_ids - 1``, takes over those
    it wins (their logs recovered, in :attr:`held`), and campaigns again for those it loses.

    ``recovered`` is called with each log taken over, before it is held (the coordinator
    finishes what its replay caught mid-way); ``spawn`` runs the campaigns."""

    def __init__(
        self,
        store: MetadataStore,
        settings: CoordinatorSettings,
        storage: LogStorage,
        counters: dict[str, int],
        *,
        spawn: Spawn,
        recovered: Callable[[HeldLog], None],
    ) -> None:
        self.store = store
        self.settings = settings
        self._storage = storage
        self._counters = counters
        self._spawn = spawn
        self._recovered = recovered
        self.held: dict[int, HeldLog] = {}
        self._taking: dict[int, Leadership] = {}
        """Ids won and not serving: their log being recovered, or kept after a take-over
        that failed and whose letting go failed too (the next take-over is made with it).
        :meth:`stop` resigns them with those held."""
        self._session: Session | None = None
        self._renewing = asyncio.Lock()

    @property
    def session(self) -> Session | None:
        """The store session the ids are campaigned for on (None before the first)."""
        return self._session

    def campaign(self) -> None:
        """Campaign for every id, each in a task of its own (:meth:`_hold`)."""
        for n in range(self.settings.v4_coordinator_ids):
            self._spawn(self._hold(n), f"v4-coordinator-id-{n}")

    async def live_session(self) -> Session:
        """The session to campaign with; a new one once it expired (the store was
        unreachable for its TTL), retrying while the store is down."""
        async with self._renewing:
            while self._session is None or self._session.is_expired:
                try:
                    self._session = await self.store.open_session(self.settings.session_ttl_s)
                except MetadataStoreError as e:
                    log.warning("v4 coordinator: no session (%s); retrying", e)
                    await asyncio.sleep(1.0)  # the store is down: retry at a gentle pace
            return self._session

    async def _hold(self, coordinator_id: int) -> None:
        """Campaign for a v4 id; on winning, recover its log; campaign again if lost, with a
        new session if the old one expired (before, an expired session or a failed take-over
        ended the campaign for good).

        A take-over that fails, for whatever reason (the store or the log away, a damaged
        record, a bug: :mod:`segtxn.coordinator.retry`), lets the id go before trying again,
        so that a coordinator able to recover the log takes it meanwhile: campaigning again
        on the same session would retake the key at once (a campaign takes a key its session
        holds), and an id whose log cannot be read here would stay with this coordinator for
        ever. (An error other than the store's or the ledger's ended this loop, the id won
        and never served, and nobody else could take it.)

        A leadership whose letting go failed too (the store refusing the delete) is still
        held and guarded: the next take-over is made with it. A campaign retook the key with
        a second guard (a task, a store watch), and an outage piled one up per take-over.

        A take-over that fails while this task is being cancelled ends the campaign (the id
        let go, the cancel raised): its log's clean-up close, failing, raises its error in
        place of the cancel. Taken for a failure and retried, the campaign went on after the
        coordinator's stop had resigned its ids and closed its session, and won the id back,
        on a new session, for a coordinator that had stopped.

        From its win to its serving (or its letting go), the leadership is in
        :attr:`_taking`, for :meth:`stop` to resign: kept in this loop alone, it outlived a
        stop (the loop cancelled), and the id stayed taken until the session's lease went
        (when the stop could not revoke it: until it expired)."""
        retry = Retry(f"v4 coordinator id {coordinator_id}: take-over", 1.0)
        while True:
            leadership = self._taking.get(coordinator_id)  # (kept: its letting go failed)
            if leadership is not None and leadership.lost.is_set():
                del self._taking[coordinator_id]
                leadership = None
            try:
                if leadership is None:
                    election = LeaderElection(
                        self.store,
                        ELECTION_PREFIX + str(coordinator_id),
                        await self.live_session(),
                        self.settings.advertise_url.encode(),
                    )
                    leadership = await election.campaign()
                    self._taking[coordinator_id] = leadership
                held = await self._recover(coordinator_id, leadership)
            except Exception as e:
                if leadership is not None and await self._let_go(coordinator_id, leadership):
                    self._taking.pop(coordinator_id, None)
                if _being_cancelled():  # (the failure came in place of the cancel)
                    log_step_failure(f"v4 coordinator id {coordinator_id}: take-over, stopped", e)
                    raise asyncio.CancelledError() from e
                await retry.after(e)
                continue
            retry.reset()
            del self._taking[coordinator_id]
            self.held[coordinator_id] = held
            log.info(
                "v4 coordinator id %d: held by this coordinator (%s); its log has %d "
                "transactions, %d being finished",
                coordinator_id,
                self.settings.advertise_url,
                len(held.txns),
                sum(m.state in (COMMITTING, ABORTING, TIME_OUT) for m in held.txns.values()),
            )
            await leadership.lost.wait()
            self.held.pop(coordinator_id, None)
            log.warning("v4 coordinator id %d: lease lost; campaigning again", coordinator_id)
            try:
                await held.log.close()
            except Exception as e:  # (it is not written to any more: campaign on)
                log_step_failure(f"v4 coordinator id {coordinator_id}: closing its log", e)
                if _being_cancelled():  # (the failure came in place of the cancel)
                    raise asyncio.CancelledError() from e

    @staticmethod
    async def _let_go(coordinator_id: int, leadership: Leadership) -> bool:
        """Resign an id whose take-over failed, so that another coordinator may take it
        meanwhile; whether it was. A failure is logged
        (:func:`~segtxn.coordinator.retry.log_step_failure`) and :meth:`_hold` goes on: the
        leadership is then still held and guarded, and its next take-over is made with it.
        (Only a store error was caught: any other one ended the loop, and the id, won and
        never served, could be taken by nobody else.)"""
        try:
            await leadership.resign()
        except Exception as e:
            log_step_failure(f"v4 coordinator id {coordinator_id}: letting the id go", e)
            return False
        return True

    async def _recover(self, coordinator_id: int, leadership: Leadership) -> HeldLog:
        txn_log = await TxnLog.open(
            log_name(coordinator_id),
            self.store,
            self._storage,
            self.settings.ledger,
            compact_entries=self.settings.v4_log_compact_entries,
            keep_ended_s=self.settings.gc_retention_s,
        )
        self._counters["replayed"] += txn_log.replayed
        held = HeldLog(leadership, txn_log, self._counters)
        self._recovered(held)
        return held

    async def stop(self, stopping: Stopping) -> None:
        """Resign every id won, held or being taken over (:attr:`_taking`), so that another
        coordinator can take it at once, then close the logs held, each step a
        :meth:`Stopping.step`. The campaigns must be cancelled first (the coordinator's stop
        does it); the session is closed by :meth:`close_session`."""
        held = dict(self.held)
        self.held.clear()
        taking = {i: t for i, t in self._taking.items() if not t.lost.is_set()}
        self._taking.clear()
        await stopping.steps(
            *((f"resigning v4 id {i}", h.leadership.resign()) for i, h in held.items()),
            *((f"resigning v4 id {i}, not serving", t.resign()) for i, t in taking.items()),
        )
        await stopping.steps(
            *((f"closing v4 id {i}'s log", h.log.close()) for i, h in held.items())
        )

    async def close_session(self, stopping: Stopping) -> None:
        """Close the store session (the coordinator's last step: after its HTTP sessions)."""
        if self._session is not None:
            await stopping.step("closing its store session", self._session.close())

    async def holder_url(self, txn: TxnId) -> str:
        """Where the holder of ``txn``'s coordinator id listens.

        Raises ServerError(TransactionNotFound / ServiceNotReady)."""
        if self._session is None:
            raise ServerError(
                ErrorName.NOT_ALLOWED,
                "v4 transactions are not enabled on this coordinator (it has no --data-dir)",
            )
        if txn.most >= self.settings.v4_coordinator_ids:
            raise ServerError(ErrorName.TRANSACTION_NOT_FOUND, f"no v4 coordinator {txn.most}")
        election = LeaderElection(self.store, ELECTION_PREFIX + str(txn.most), self._session, b"")
        leader = await election.leader()
        if leader is None:
            raise ServerError(ErrorName.SERVICE_NOT_READY, f"v4 coordinator {txn.most} is down")
        return leader.value.decode()


def _being_cancelled() -> bool:
    """Whether the current task was asked to cancel (a failure it is handling may have
    come in place of that cancel, raised by a clean-up on its way out)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
