"""Checks on the v4 transactions clients name, and an end for the ones nobody will end.

A broker knows a v4 (PIP-31) transaction only by the id in a send or an ack; the markers
that end it come from its coordinator. Trusting the id let anyone stall a
``persistent://`` topic for good (issue 15, item 6): a send naming an id no coordinator
ever issued was stored as an open transaction's entry, and readers and consumers stopped
before it (``max_read_position``), across restarts, since recovery replays it. The v5 path
never had the hole: its participants read the transaction's header before writing.

**Admission** (Kafka's KIP-890 transaction verification). The first transactional send of
a transaction on a topic, or its first ack on a subscription, asks the transaction's
coordinator — the process holding v4 coordinator id ``most`` (its election record names
it; without a holder, any live coordinator, which answers for the id) — for the
transaction (``GET /txn/v2/{txn}``). It is admitted if it is OPEN, within its timeout, and
has this topic among its partitions (this subscription among its subscriptions), as
ADD_PARTITION_TO_TXN / ADD_SUBSCRIPTION_TO_TXN left it. The participant is then remembered
until the transaction ends there: later sends and acks pass without a call. Refused:
``TransactionNotFound`` (its coordinator does not know it), ``InvalidTxnStatus`` (not open,
past its timeout, or not registered for this topic or subscription), ``ServiceNotReady``
(no coordinator answered within ``check_timeout_s``: retriable), ``TooManyRequests`` (more
than :data:`MAX_TRACKED` transactions open here).

**Expiry.** Every transaction holding entries or acks here is tracked with its deadline
(learned at admission; for one found by recovery, asked of its coordinator, else assumed
``max_timeout_s`` after it was found). A sweep ends the ones still here ``grace_s`` past
their deadline, on every participant of this broker: with the coordinator's decision if it
answers (COMMITTING or COMMITTED: commit; ABORTING, TIME_OUT or ABORTED: abort; still OPEN:
abort, since a commit past the deadline is refused), else — the coordinator does not know
it, or none answers — aborted (an abort marker; acks released). So no client can pin a
topic's read horizon for longer than its transaction's timeout and the grace.

The price, as with Kafka's tools for hanging transactions (KIP-664), which leave it to an
operator: a coordinator that decided COMMIT and then stayed away for longer than the grace
past the deadline finds this participant aborted; its END is refused (InvalidTxnStatus) and
the transaction stays COMMITTING, logged at WARNING on both sides.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
import msgspec

from segtxn.auth import AuthSettings
from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.settings import V4TxnSettings
from segtxn.ledger import LedgerError
from segtxn.metastore import MetadataStore, MetadataStoreError
from segtxn.metastore.election import ELECTIONS_PREFIX
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnAction, TxnId
from segtxn.stopping import Stopping
from segtxn.topics.transactions import COORDINATOR_MEMBERS, V4_COORDINATOR_ELECTION

log = logging.getLogger(__name__)

MAX_TRACKED = 100_000
"""Open v4 transactions a broker tracks; a new one beyond is refused (TooManyRequests)."""
SWEEP_CONCURRENCY = 16
"""Coordinator questions one sweep asks at once."""
COMMITTING_STATES = frozenset({"COMMITTING", "COMMITTED"})
ABORTING_STATES = frozenset({"ABORTING", "TIME_OUT", "ABORTED"})


class Participant(Protocol):
    """A topic's transaction buffer or a subscription's pending-ack store (``str()``
    names it in logs)."""

    async def end(self, txn: TxnId, action: TxnAction) -> bool:
        """End ``txn`` here, as ``action`` says; whether this call ended it (False: it
        had ended so already: its coordinator's END and the sweep crossed)."""
        ...


class TxnStatus(msgspec.Struct, frozen=True, rename="camel"):
    """A v4 coordinator's answer to ``GET /txn/v2/{txn}`` (the fields used here)."""

    state: str
    timeout_ms: int
    partitions: list[str] = msgspec.field(default_factory=list)
    subscriptions: list[tuple[str, str]] = msgspec.field(default_factory=list)
    owner: str | None = None
    """The role that opened it (security on)."""


@dataclass(eq=False)
class _Tracked:
    deadline_ms: int | None
    """The coordinator's deadline (epoch ms); None until known (found by recovery)."""
    found_ms: float
    participants: set[Participant] = field(default_factory=set)


def _now_ms() -> float:
    return time.time() * 1000


class V4TransactionChecks:
    """Admission of v4 transactions to this broker's topics, and their expiry (module
    docstring). One per broker; :meth:`start` runs the sweep."""

    def __init__(
        self,
        store: MetadataStore,
        settings: V4TxnSettings,
        metrics: BrokerMetrics | None = None,
        auth: AuthSettings | None = None,
    ) -> None:
        self._store = store
        self.settings = settings
        self._metrics = metrics
        self._tracked: dict[TxnId, _Tracked] = {}
        self._checking: dict[tuple[TxnId, Participant], asyncio.Task[None]] = {}
        self._http: aiohttp.ClientSession | None = None
        self._auth = auth or AuthSettings()
        """Calls to coordinators go as the cluster role (and over TLS if on)."""
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._http = self._auth.cluster_session()
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="v4-txn-sweep")

    async def stop(self, stopping: Stopping) -> None:
        """Cancel the sweep and the checks in flight, waiting for them
        :data:`~segtxn.stopping.CANCELLED_END_S` at most (:meth:`Stopping.cancel`), then
        close the HTTP session (a step of ``stopping``, the broker's). Never raises but a
        cancellation.

        Why the bound: a sweep cancelled while it ends a transaction on a participant ends
        when that end does (its marker's write), and the broker's stop gives its steps no
        time limit until the store failed one. Waited for without a bound, a write waiting
        for a silent store held the broker's stop as long, before any topic was closed."""
        tasks = [*self._checking.values(), *([self._sweeper] if self._sweeper else [])]
        self._sweeper = None
        await stopping.cancel("its v4 transaction sweep and checks", tasks)
        if self._http is not None:
            http, self._http = self._http, None
            await stopping.step("closing its v4 checks' HTTP session", http.close())

    @property
    def tracked(self) -> set[TxnId]:
        """Transactions with entries or acks held here (for tests and stats)."""
        return set(self._tracked)

    # ------------------------------------------------------------------ admission

    async def admit_write(self, txn: TxnId, topic: str, participant: Participant) -> None:
        """Before the first transactional send of ``txn`` on ``topic`` (module docstring).

        Raises ServerError(TransactionNotFound / InvalidTxnStatus / ServiceNotReady /
        TooManyRequests)."""
        await self._admit(
            txn,
            participant,
            lambda status: topic in status.partitions,
            f"{topic} was not added to {txn} (ADD_PARTITION_TO_TXN comes before a send)",
        )

    async def admit_ack(
        self, txn: TxnId, topic: str, subscription: str, participant: Participant
    ) -> None:
        """Before the first ack of ``txn`` on ``subscription``; raises as
        :meth:`admit_write`."""
        await self._admit(
            txn,
            participant,
            lambda status: (topic, subscription) in status.subscriptions,
            f"subscription {subscription!r} of {topic} was not added to {txn} "
            "(ADD_SUBSCRIPTION_TO_TXN comes before an ack)",
        )

    async def _admit(
        self,
        txn: TxnId,
        participant: Participant,
        registered: Callable[[TxnStatus], bool],
        unregistered: str,
    ) -> None:
        tracked = self._tracked.get(txn)
        if tracked is not None and participant in tracked.participants:
            return  # checked already: cached until it ends here
        key = (txn, participant)
        check = self._checking.get(key)
        if check is None:  # concurrent sends share one question
            check = asyncio.create_task(
                self._check(txn, participant, registered, unregistered), name=f"v4-check-{txn}"
            )
            self._checking[key] = check
            check.add_done_callback(lambda done: self._checked(key, done))
        await asyncio.shield(check)  # one caller giving up does not end it for the others

    def _checked(self, key: tuple[TxnId, Participant], check: asyncio.Task[None]) -> None:
        self._checking.pop(key, None)  # a refusal is not cached: the next send asks again
        if not check.cancelled():
            check.exception()  # retrieved: every caller waiting got it raised

    async def _check(
        self,
        txn: TxnId,
        participant: Participant,
        registered: Callable[[TxnStatus], bool],
        unregistered: str,
    ) -> None:
        if txn not in self._tracked and len(self._tracked) >= MAX_TRACKED:
            self._count("busy")
            raise ServerError(
                ErrorName.TOO_MANY_REQUESTS,
                f"{MAX_TRACKED} v4 transactions are open on this broker; try again later",
            )
        try:
            status = await self._status(txn)
        except ServerError as e:
            self._count("not_found" if e.name is ErrorName.TRANSACTION_NOT_FOUND else "unavailable")
            log.info("txn %s refused on %s: %s", txn, participant, e)
            raise
        now_ms = _now_ms()
        refusal = None
        if status.state != "OPEN":
            refusal = f"{txn} is {status.state}"
        elif now_ms > status.timeout_ms:
            refusal = f"{txn} is past its timeout"
        elif not registered(status):
            refusal = unregistered
        if refusal is not None:
            self._count("status")
            log.info("txn %s refused on %s: %s", txn, participant, refusal)
            raise ServerError(ErrorName.INVALID_TXN_STATUS, refusal)
        tracked = self._tracked.setdefault(txn, _Tracked(status.timeout_ms, now_ms))
        tracked.deadline_ms = status.timeout_ms
        tracked.participants.add(participant)
        self._count("admitted")

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.txn_v4_checks.add(1, {"result": result})

    async def owner(self, txn: TxnId) -> str | None:
        """The role that opened ``txn``, as its coordinator says (None: opened with
        security off).

        Raises:
            ServerError: TransactionNotFound, or ServiceNotReady (no coordinator answered).
        """
        return (await self._status(txn)).owner

    async def _status(self, txn: TxnId) -> TxnStatus:
        """Ask the transaction's coordinator.

        Raises:
            ServerError: its answer (TransactionNotFound, ...), or ServiceNotReady when no
                coordinator answered within ``check_timeout_s``.
        """
        try:
            async with asyncio.timeout(self.settings.check_timeout_s):
                url = await self._coordinator_url(txn)
                async with self.http.get(f"{url.rstrip('/')}/txn/v2/{txn}") as response:
                    body = await response.json(content_type=None)
                    status = response.status
        except (aiohttp.ClientError, TimeoutError, MetadataStoreError, ValueError) as e:
            raise ServerError(
                ErrorName.SERVICE_NOT_READY, f"the coordinator of {txn} did not answer: {e!r}"
            ) from e
        if status >= 300:
            fields = body if isinstance(body, dict) else {}
            try:
                name = ErrorName(str(fields.get("error")))
            except ValueError:
                name = ErrorName.UNKNOWN
            message = fields.get("message") or f"HTTP {status}"
            raise ServerError(name, f"the coordinator of {txn}: {message}")
        try:
            return msgspec.convert(body, TxnStatus)
        except msgspec.ValidationError as e:
            raise ServerError(ErrorName.UNKNOWN, f"the coordinator of {txn}: {e}") from e

    async def _coordinator_url(self, txn: TxnId) -> str:
        """The holder of ``txn``'s coordinator id; else any live coordinator (it answers
        for ids it does not hold: forwarded, TransactionNotFound, or ServiceNotReady)."""
        holder = await self._store.get(ELECTIONS_PREFIX + V4_COORDINATOR_ELECTION + str(txn.most))
        if holder is not None:
            return holder.value.decode()
        members = await self._store.list_prefix(COORDINATOR_MEMBERS, limit=1)
        if members.records:
            return members.records[0].value.decode()
        raise ServerError(ErrorName.SERVICE_NOT_READY, "no transaction coordinator is up")

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise ServerError(ErrorName.SERVICE_NOT_READY, "the broker is not started")
        return self._http

    # ------------------------------------------------------------------ participants

    def recovered(self, txn: TxnId, participant: Participant) -> None:
        """Recovery found ``txn`` open on ``participant`` (never refused: it is there)."""
        tracked = self._tracked.setdefault(txn, _Tracked(None, _now_ms()))
        tracked.participants.add(participant)

    def ended(self, txn: TxnId, participant: Participant) -> None:
        """``txn`` ended on ``participant`` (its coordinator's END, or the sweep's)."""
        tracked = self._tracked.get(txn)
        if tracked is not None:
            tracked.participants.discard(participant)
            if not tracked.participants:
                del self._tracked[txn]

    def forget(self, participant: Participant) -> None:
        """``participant`` was closed (its topic unloaded): recovery brings it back."""
        for txn, tracked in list(self._tracked.items()):
            if participant in tracked.participants:
                self.ended(txn, participant)

    # ------------------------------------------------------------------ expiry

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_s)  # the sweep interval
            try:
                await self.sweep()
            except Exception:
                log.exception("v4 transaction sweep failed; the next one tries again")

    async def sweep(self) -> int:
        """End, on their participants here, the transactions ``grace_s`` past their
        deadline (and ask about those whose deadline is unknown). Returns how many
        participants it ended a transaction on."""
        now_ms = _now_ms()
        grace_ms = self.settings.grace_s * 1000
        due = [
            (txn, tracked)
            for txn, tracked in self._tracked.items()
            if tracked.deadline_ms is None or now_ms > tracked.deadline_ms + grace_ms
        ]
        if not due:
            return 0
        limit = asyncio.Semaphore(SWEEP_CONCURRENCY)

        async def one(txn: TxnId, tracked: _Tracked) -> int:
            async with limit:
                return await self._expire(txn, tracked)

        return sum(await asyncio.gather(*(one(txn, tracked) for txn, tracked in due)))

    async def _expire(self, txn: TxnId, tracked: _Tracked) -> int:
        action, why = await self._decide(txn, tracked)
        if action is None:
            return 0
        if tracked.deadline_ms is None:
            age = f"found {(_now_ms() - tracked.found_ms) / 1000:.1f} s ago, timeout unknown"
        else:
            age = f"{(_now_ms() - tracked.deadline_ms) / 1000:.1f} s past its timeout"
        ended = 0
        for participant in list(tracked.participants):
            if not self._tracks(txn, participant):  # ended or closed since the round began
                log.debug("txn %s: ended on %s or closed meanwhile; passed over", txn, participant)
                continue
            if await self._end_on(participant, txn, action):
                ended += 1
                if self._metrics is not None:
                    self._metrics.txn_v4_ended_here.add(
                        1, {"outcome": action.value, "why": why.split(":")[0]}
                    )
                log.warning(
                    "txn %s: %s on %s by this broker, %s: %s",
                    txn,
                    "committed" if action is TxnAction.COMMIT else "aborted",
                    participant,
                    age,
                    why,
                )
        return ended

    def _tracks(self, txn: TxnId, participant: Participant) -> bool:
        """Whether ``txn`` is still open on ``participant`` as far as the checks know: not
        ended there (:meth:`ended`), nor closed (:meth:`forget`: its topic unloaded)."""
        tracked = self._tracked.get(txn)
        return tracked is not None and participant in tracked.participants

    async def _end_on(self, participant: Participant, txn: TxnId, action: TxnAction) -> bool:
        """End ``txn`` on ``participant`` for the sweep; whether the sweep ended it there.

        Not when it had ended so already: its coordinator's END landed while the sweep ran
        (on this participant while the sweep ended another, or asked the coordinator).
        That one the sweep logged at WARNING and counted as its own, telling an operator
        the broker had ended a transaction its coordinator ended.

        Nor when the participant could not take it: refused (a terminated topic, or ended
        the other way: WARNING, and not tried again), or its ledger or the store failed
        (WARNING; it stays tracked, for the next round to try again). A participant closed
        meanwhile (its topic unloaded while the sweep ended another or this one: its
        ledger is closed) is passed over at DEBUG: its next load recovers the transaction
        open, and a round ends it there. Such a failure, not a ``ServerError``, was raised
        out of the round, which failed with a traceback, the rest of it undone."""
        try:
            ended_here = await participant.end(txn, action)
        except ServerError as e:
            log.warning(
                "txn %s: ending it (%s) on %s failed: %s", txn, action.value, participant, e
            )
            self.ended(txn, participant)
            return False
        except (LedgerError, MetadataStoreError) as e:
            if self._tracks(txn, participant):
                log.warning(
                    "txn %s: ending it (%s) on %s failed (the next sweep tries again): %s: %s",
                    txn, action.value, participant, type(e).__name__, e,
                )  # fmt: skip
            else:
                log.debug(
                    "txn %s: %s was closed while it was ended (%s); its next load recovers it",
                    txn, participant, e,
                )  # fmt: skip
            return False
        self.ended(txn, participant)
        if not ended_here:
            log.debug(
                "txn %s: ended on %s already (its coordinator's END came first)", txn, participant
            )
        return ended_here

    async def _decide(self, txn: TxnId, tracked: _Tracked) -> tuple[TxnAction | None, str]:
        """What to do about a transaction due for it: its coordinator's decision, an abort,
        or nothing yet (None)."""
        grace_ms = self.settings.grace_s * 1000
        try:
            status = await self._status(txn)
        except ServerError as e:
            if e.name is ErrorName.TRANSACTION_NOT_FOUND:
                return TxnAction.ABORT, "coordinator-unknown: its coordinator does not know it"
            deadline = tracked.deadline_ms
            if deadline is None:
                deadline = int(tracked.found_ms + self.settings.max_timeout_s * 1000)
            if _now_ms() > deadline + grace_ms:
                return TxnAction.ABORT, f"no-answer: {e.message}"
            return None, ""
        tracked.deadline_ms = status.timeout_ms
        if status.state in COMMITTING_STATES:
            return TxnAction.COMMIT, f"decided: its coordinator has it {status.state}"
        if status.state in ABORTING_STATES:
            return TxnAction.ABORT, f"decided: its coordinator has it {status.state}"
        if _now_ms() > status.timeout_ms + grace_ms:
            return TxnAction.ABORT, "expired: still OPEN at its coordinator"
        return None, ""
