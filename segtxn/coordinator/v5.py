"""The v5 transaction coordinator: transaction state is a few records, never a log.

- ``NEW_TXN`` creates ``/txn/<txnId>`` OPEN, indexed by deadline. The id's ``most`` is a v5
  coordinator id this process holds (a lease, via leader election); ``least`` comes from a
  block reserved with a CAS at ``/txn-coordinators/ids/<most>``, so ids are never reused,
  even across take-overs (:mod:`segtxn.coordinator.v5ids`). Creation is guarded by the
  election's fencing token, so a deposed holder cannot mint ids any more.
- ``ADD_PARTITION_TO_TXN`` / ``ADD_SUBSCRIPTION_TO_TXN`` are accepted and change nothing
  (participants write their own op records); they only refuse topics of the wrong domain.
- ``END_TXN`` is one CAS of the header from OPEN to COMMITTED/ABORTED, setting
  ``finalized_ms`` and moving the header from the deadline index to the final-state index
  in the same step. Repeating the same decision succeeds; the opposite one fails with
  ``InvalidTxnStatus``; committing after the deadline aborts instead. The coordinator never
  calls a participant: they learn the outcome by watching headers.
- The **timeout sweep** aborts OPEN transactions of the ids it holds whose deadline passed.
- The **GC sweep** deletes final headers older than the retention window once no op record
  of theirs remains (participants delete their own after materializing). Op records a
  participant never cleaned are only force-deleted after ``abandon_after_s`` (off by
  default): deleting them early could make a crashed participant misjudge committed data.

Any coordinator process may end any v5 transaction (the CAS arbitrates); standbys take
over the ids of a dead process by winning their elections, with nothing to replay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import msgspec

from segtxn.aio import first_completed
from segtxn.coordinator import sweeps
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.v5ids import Held, HeldIds
from segtxn.metastore import (
    MUST_NOT_EXIST,
    BadVersion,
    Check,
    IndexEntry,
    MetadataStore,
    NotFound,
    Put,
)
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import MAX_NEW_TXNS
from segtxn.protocol.txn import TxnAction, TxnId, TxnState, check_participants
from segtxn.stopping import Stopping
from segtxn.topics import transactions as T

log = logging.getLogger(__name__)

PAGE = 500
"""Headers a sweep reads per store request: each index entry holds a copy of its header, and
one answer holding every final header of a busy cluster's backlog outgrew what a store
answer may carry (etcd: 8 MiB, about 40,000 headers): the sweep then failed every time."""


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _each(pages: AsyncIterator[list[IndexEntry]]) -> AsyncIterator[IndexEntry]:
    async for page in pages:
        for entry in page:
            yield entry


class CoordinatorV5:
    def __init__(self, store: MetadataStore, settings: CoordinatorSettings) -> None:
        self.store = store
        self.settings = settings
        self.ids = HeldIds(store, settings)
        self._sweeper: asyncio.Task[None] | None = None
        self._created: dict[TxnId, tuple[T.TxnHeader, int]] = {}
        """OPEN headers this process created, with their versions: END_TXN's CAS needs no
        read for them (a stale one fails the CAS, and the read follows). Dropped when ended
        here or past their deadline (the timeout sweep)."""
        self.counters: dict[str, int] = {
            "opened": 0,
            "committed": 0,
            "aborted": 0,
            "header_cas_ok": 0,
            "header_cas_conflict": 0,
            "header_cas_reject": 0,
            "timeouts": 0,
            "gc_headers": 0,
            "gc_forced_ops": 0,
        }
        self.gc_backlog = 0
        """Op records of finalized transactions not yet cleaned by participants (last sweep)."""

    @property
    def held(self) -> dict[int, Held]:
        """The coordinator ids this process holds now."""
        return self.ids.held

    @property
    def ready(self) -> asyncio.Event:
        """Set once an id is held."""
        return self.ids.ready

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Register and campaign for the ids (:class:`HeldIds`), and start the sweeps.

        Raises:
            MetadataStoreError: the store could not register this process.
        """
        await self.ids.start()
        self._sweeper = asyncio.create_task(self._sweeps(), name="coordinator-sweeps")

    async def stop(self, stopping: Stopping | None = None) -> None:
        """Stop the sweeps, then the ids (:meth:`HeldIds.stop`: never raises but a
        cancellation, within ``stopping``'s time)."""
        stopping = stopping or Stopping("coordinator")
        if self._sweeper is not None:
            await stopping.cancel("its sweeps", [self._sweeper])
        await self.ids.stop(stopping)

    # ------------------------------------------------------------------ NEW_TXN

    async def new_txn(
        self, timeout_s: float | None = None, owner: str | None = None
    ) -> tuple[TxnId, T.TxnHeader]:
        """Create an OPEN transaction, recording ``owner`` (the role that opens it, with
        security on) in its header.

        Raises:
            ServerError(InvalidArgument): a timeout outside (0, max_timeout_s].
            ServerError(ServiceNotReady): this process holds no coordinator id.
        """
        (opened,) = await self.new_txns(1, timeout_s, owner)
        return opened

    async def new_txns(
        self, count: int, timeout_s: float | None = None, owner: str | None = None
    ) -> list[tuple[TxnId, T.TxnHeader]]:
        """Create ``count`` OPEN transactions (as :meth:`new_txn`) in one store step: a
        client that pre-starts transactions gets several for one round trip and one write.

        Raises:
            ServerError(InvalidArgument): a count outside [1, MAX_NEW_TXNS], or a timeout
                outside (0, max_timeout_s].
            ServerError(ServiceNotReady): this process holds no coordinator id.
        """
        if not 1 <= count <= MAX_NEW_TXNS:
            raise ServerError(
                ErrorName.INVALID_ARGUMENT, f"count must be in [1, {MAX_NEW_TXNS}], not {count}"
            )
        timeout = self.settings.default_timeout_s if timeout_s is None else timeout_s
        if not 0 < timeout <= self.settings.max_timeout_s:
            raise ServerError(
                ErrorName.INVALID_ARGUMENT,
                f"timeout must be in (0, {self.settings.max_timeout_s}] seconds, not {timeout}",
            )
        coordinator_id, held = self.ids.pick()
        now_ms = int(time.time() * 1000)
        header = T.TxnHeader(TxnState.OPEN, now_ms + int(timeout * 1000), now_ms, owner=owner)
        txns = [
            TxnId(coordinator_id, await self.ids.next_least(coordinator_id, held))
            for _ in range(count)
        ]
        election_key = held.leadership.election.key
        try:
            written = await self.store.commit(
                [
                    Check(election_key, held.leadership.token),  # fencing
                    *(
                        Put(
                            T.header_key(txn),
                            T.encode(header),
                            expected_version=MUST_NOT_EXIST,
                            partition_key=txn.key,
                            indexes=T.header_indexes(header),
                        )
                        for txn in txns
                    ),
                ]
            )
        except (BadVersion, NotFound) as e:
            if getattr(e, "key", None) == election_key:
                raise ServerError(
                    ErrorName.SERVICE_NOT_READY, f"lost coordinator id {coordinator_id:x}"
                ) from e
            raise
        for txn, record in zip(txns, written[1:], strict=True):
            if record is not None:
                self._created[txn] = (header, record.version)
            log.debug("txn %s: opened (timeout %g s)", txn, timeout)
        self.counters["opened"] += count
        return [(txn, header) for txn in txns]

    # ------------------------------------------------------------------ ADD_*_TO_TXN

    def add_participants(self, txn: TxnId, topics: list[str]) -> None:
        """No-op for v5 beyond checking that every topic can take part.

        Raises:
            ServerError(NotAllowed / InvalidTopicName / InvalidArgument)
        """
        self._check_v5(txn)
        check_participants(topics, v5=True)

    @staticmethod
    def _check_v5(txn: TxnId) -> None:
        if not txn.is_v5:
            raise ServerError(
                ErrorName.NOT_ALLOWED,
                f"{txn} is a v4 transaction id; this is the v5 coordinator",
            )

    # ------------------------------------------------------------------ END_TXN

    async def owner(self, txn: TxnId) -> str | None:
        """The role that opened ``txn`` (None: opened with security off). A header this
        process created is not read again (its owner never changes), so the owner check
        costs a secured END_TXN no store read.

        Raises:
            ServerError(TransactionNotFound)
        """
        created = self._created.get(txn)
        if created is not None:
            return created[0].owner
        return (await self.status(txn)).owner

    async def status(self, txn: TxnId) -> T.TxnHeader:
        self._check_v5(txn)
        record = await self.store.get(T.header_key(txn))
        if record is None:
            raise ServerError(ErrorName.TRANSACTION_NOT_FOUND, f"no transaction {txn}")
        return T.decode_header(record.value)

    async def end_txn(self, txn: TxnId, action: TxnAction, trace: str | None = None) -> T.TxnHeader:
        """Decide a transaction: one CAS on its header. ``trace``: the traced END_TXN's
        ``traceparent``, kept in the final header for the participants' spans.

        Raises:
            ServerError(TransactionNotFound / InvalidTxnStatus)
        """
        self._check_v5(txn)
        key = T.header_key(txn)
        created = self._created.pop(txn, None)
        while True:
            if created is not None:  # as this process created it: the CAS checks that
                header, version = created
                created = None
            else:
                record = await self.store.get(key)
                if record is None:
                    raise ServerError(ErrorName.TRANSACTION_NOT_FOUND, f"no transaction {txn}")
                header, version = T.decode_header(record.value), record.version
            if header.state is action.outcome:
                return header  # the same decision again: a harmless success
            if header.state.final:
                self.counters["header_cas_reject"] += 1
                log.info(
                    "txn %s: %s refused, already %s (%.1f s after it was created)",
                    txn,
                    action.value,
                    header.state.value,
                    ((header.finalized_ms or _now_ms()) - header.created_ms) / 1000,
                )
                raise ServerError(
                    ErrorName.INVALID_TXN_STATUS,
                    f"{txn} is already {header.state}; cannot {action}",
                )
            now_ms = _now_ms()
            outcome = action.outcome
            late = action is TxnAction.COMMIT and now_ms > header.timeout_ms
            if late:
                outcome = TxnState.ABORTED
            final = msgspec.structs.replace(header, state=outcome, finalized_ms=now_ms, trace=trace)
            try:
                await self.store.put(
                    key,
                    T.encode(final),
                    expected_version=version,
                    partition_key=txn.key,
                    indexes=T.header_indexes(final),
                )
            except (BadVersion, NotFound):
                self.counters["header_cas_conflict"] += 1
                continue  # decided concurrently (a timeout, another client): look again
            self.counters["header_cas_ok"] += 1
            self.counters["committed" if outcome is TxnState.COMMITTED else "aborted"] += 1
            if late:
                log.info(
                    "txn %s: COMMIT came %.1f s past its timeout of %.1f s: aborted instead",
                    txn,
                    (now_ms - header.timeout_ms) / 1000,
                    (header.timeout_ms - header.created_ms) / 1000,
                )
                raise ServerError(
                    ErrorName.INVALID_TXN_STATUS, f"{txn} timed out before the commit: aborted"
                )
            log.debug("txn %s: %s", txn, outcome.value)
            return final

    async def list_open(self, limit: int = 1000) -> list[tuple[TxnId, T.TxnHeader]]:
        """OPEN transactions (any coordinator id), soonest deadline first."""
        due = await self.store.index_range(T.IDX_DEADLINE, limit=limit)
        return [(T.txn_of_header_key(e.key), T.decode_header(e.value)) for e in due.entries]

    async def count_open(self, limit: int) -> int:
        """How many transactions are OPEN (any coordinator id), counted up to ``limit``, a
        page at a time (their headers together may exceed one store answer)."""
        count = 0
        async for page in self.store.index_pages(T.IDX_DEADLINE, page=PAGE):
            count += len(page)
            if count >= limit:
                return limit
        return count

    # ------------------------------------------------------------------ sweeps

    async def _sweeps(self) -> None:
        """Both sweeps until cancelled; a failed round of one stops neither
        (:func:`sweeps.every`)."""
        await first_completed(
            sweeps.every("timeout sweep", self.settings.timeout_sweep_s, self.sweep_timeouts),
            sweeps.every("gc sweep", self.settings.gc_sweep_s, self.sweep_gc),
            name="coordinator-sweep",
        )

    async def sweep_timeouts(self, now_ms: int | None = None) -> int:
        """Abort OPEN transactions of held ids whose deadline passed; returns how many."""
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        for txn, (header, _) in list(self._created.items()):
            if header.timeout_ms < now_ms:  # decided by a sweep (here or elsewhere) or late
                del self._created[txn]
        due = [
            entry
            async for page in self.store.index_pages(T.IDX_DEADLINE, 0, now_ms + 1, page=PAGE)
            for entry in page
        ]
        aborted = 0
        for entry in due:
            txn = T.txn_of_header_key(entry.key)
            if txn.most not in self.held:
                continue
            try:
                await self.end_txn(txn, TxnAction.ABORT)
                aborted += 1
            except ServerError as e:
                if e.name not in (ErrorName.INVALID_TXN_STATUS, ErrorName.TRANSACTION_NOT_FOUND):
                    raise
                continue  # ended meanwhile: not a timeout
            header = T.decode_header(entry.value)
            log.info(
                "txn %s: timed out, aborted by the sweep (age %.1f s, timeout %.1f s)",
                txn,
                (now_ms - header.created_ms) / 1000,
                (header.timeout_ms - header.created_ms) / 1000,
            )
        self.counters["timeouts"] += aborted
        return aborted

    async def sweep_gc(self, now_ms: int | None = None) -> int:
        """Delete final headers past retention whose op records are gone; returns how many."""
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        horizon = now_ms - int(self.settings.gc_retention_s * 1000)
        abandon = now_ms - int(self.settings.abandon_after_s * 1000)
        deleted = backlog = forced = 0
        for state in (TxnState.COMMITTED, TxnState.ABORTED):
            pages = self.store.index_pages(
                T.IDX_FINAL, (state.value, 0), (state.value, horizon + 1), page=PAGE
            )
            async for entry in _each(pages):
                txn = T.txn_of_header_key(entry.key)
                header = T.decode_header(entry.value)
                ops = await self.store.list_prefix(T.ops_prefix(txn))
                if ops.records:
                    if self.settings.abandon_after_s and (header.finalized_ms or 0) <= abandon:
                        removed = await self.store.delete_range(T.ops_prefix(txn))
                        self.counters["gc_forced_ops"] += removed
                        forced += removed
                    else:
                        backlog += len(ops.records)
                        continue
                try:
                    await self.store.delete(entry.key, expected_version=entry.version)
                    deleted += 1
                except (BadVersion, NotFound):
                    continue
        if deleted or forced or backlog != self.gc_backlog:
            log.info(
                "gc sweep: deleted %d final headers%s; backlog %d op records (was %d)",
                deleted,
                f", force-deleted {forced} abandoned op records" if forced else "",
                backlog,
                self.gc_backlog,
            )
        self.gc_backlog = backlog
        self.counters["gc_headers"] += deleted
        return deleted
