"""What an open managed ledger does to its closed ledgers: retention's trims and repair's
placement moves.

The part of :class:`~segtxn.ledger.managed.ManagedLedger` (which extends this) that changes
the chain behind the ledger being appended to. Each change is one metadata compare-and-set,
made in turn with the owner's others (:meth:`~segtxn.ledger.appends.LedgerAppends._update`:
a crash leaves the record as it was or as it became, and a cancel lets the CAS end first),
and each lets go of the logs the record no longer names for it only once the reads in flight
on them end (:mod:`segtxn.ledger.handles`):

- :meth:`LedgerUpkeep.trim` removes the oldest closed ledgers that a retention policy lets
  go and no cursor still needs (the rules: :mod:`segtxn.ledger.retention`), never past a
  file that is not its own (:mod:`segtxn.ledger.identity`);
- :meth:`LedgerUpkeep.move_ledger` records that a closed ledger's copies are kept elsewhere
  (:mod:`segtxn.ledger.replicas.repair`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

import msgspec

from segtxn.ledger.appends import LedgerAppends
from segtxn.ledger.cursor import ManagedCursor
from segtxn.ledger.errors import LedgerClosed, report_once
from segtxn.ledger.identity import own_prefix
from segtxn.ledger.logs import Placement
from segtxn.ledger.metadata import LedgerInfo, LedgerMetadata, moved
from segtxn.ledger.retention import (
    ClosedLedger,
    RetentionPolicy,
    TrimResult,
    closed_ledgers,
    deletable,
)

log = logging.getLogger(__name__)


class LedgerUpkeep(LedgerAppends):
    """Trims and placement moves of the closed ledgers (see the module docstring). The
    managed ledger that extends it keeps these attributes current."""

    cursors: dict[str, ManagedCursor]
    """The ledger's cursors: each holds back what it has not consumed (:meth:`trim`)."""

    async def trim(self, policy: RetentionPolicy, *, now_s: float | None = None) -> TrimResult:
        """Delete the oldest closed ledgers that ``policy`` lets go (the rules, unconsumed
        data never among them: :mod:`segtxn.ledger.retention`). A ledger being read is
        deleted once its reads end; reads that start later skip it. A ledger whose file is
        not its own (another nonce: a foreign volume, a wrong restore) is never deleted:
        the trim stops before it, says so at ERROR (once per file, then at DEBUG), and
        the metadata keeps naming it
        (:mod:`segtxn.ledger.identity`).

        Each cursor holds data back from its mark in memory (what its dispatcher reads on
        from, lower after a seek back that is not saved yet) *and* from its persisted mark
        (:attr:`ManagedCursor.persisted_mark_delete`): a restart restores the cursor from
        the store, and the entries its saved state counts as unacknowledged are delivered
        again from there. An acknowledgment whose save failed or is still pending releases
        nothing, as Pulsar trims only behind each cursor's persisted mark-delete position.

        Returns what was removed (higher layers trim their own per-entry indexes by it),
        with the ledgers an earlier trim removed though it seemed to fail (its answer and
        the read-back were lost; its state was found landed since) or whose caller was
        cancelled once it landed.
        """
        now_ms = (time.time() if now_s is None else now_s) * 1000
        own = await self._own_files(self._deletable(self._meta, policy, now_ms))
        removable: list[ClosedLedger] = []
        infos: dict[int, LedgerInfo] = {}

        def drop(meta: LedgerMetadata) -> LedgerMetadata | None:
            # chosen under the metadata lock: concurrent trims never remove a ledger twice
            chosen = self._deletable(meta, policy, now_ms)
            removable[:] = itertools.takewhile(lambda c: c.id in own, chosen)
            gone = {i.id for i in removable}
            if not gone:
                return None
            infos.update((i.id, i) for i in meta.ledgers if i.id in gone)
            return msgspec.structs.replace(
                meta, ledgers=[i for i in meta.ledgers if i.id not in gone]
            )

        async def dropped(_: LedgerMetadata) -> None:  # run with the CAS (see _update);
            for ledger in removable:  # reported below, or by the next trim if cancelled
                self._let_go.append(infos[ledger.id])
                await self._logs.doom(infos[ledger.id])  # deleted now, or once reads end

        await self._update(drop, landed=dropped)
        let_go, self._let_go = self._let_go, []  # their files are deleted already
        if not let_go:
            return TrimResult([], 0, None)
        return TrimResult(
            sorted(i.id for i in let_go), sum(i.entries or 0 for i in let_go), self.first_position()
        )

    def _deletable(
        self, meta: LedgerMetadata, policy: RetentionPolicy, now_ms: float
    ) -> list[ClosedLedger]:
        marks = [min(c.mark_delete, c.persisted_mark_delete) for c in self.cursors.values()]
        return deletable(closed_ledgers(meta.ledgers, self._open_size), marks, policy, now_ms)

    async def _own_files(self, chosen: list[ClosedLedger]) -> set[int]:
        """The ids of the front of ``chosen`` whose files are their own: a trim deletes
        no further, so a foreign file (a wrong volume, a wrong restore) stays named by the
        metadata, refused when read and never deleted; said at ERROR the first time
        (:func:`report_once`: every round meets it until an operator acts)."""
        ids = {c.id for c in chosen}
        infos = [i for i in self._meta.ledgers if i.id in ids]
        own, foreign = await asyncio.to_thread(own_prefix, self.name, self._storage, infos)
        if foreign is not None:
            report_once(
                log,
                foreign,
                "%s: retention keeps ledger %d and the ledgers after it, as its file is "
                "not its own: %s",
                self.name,
                infos[len(own)].id,
                foreign,
            )
        return {i.id for i in own}

    async def move_ledger(self, ledger_id: int, was: Placement, now: Placement) -> bool:
        """Record that the closed ledger ``ledger_id`` is kept on ``now`` instead of
        ``was`` (:mod:`segtxn.ledger.replicas.repair` made complete, synced copies), in a
        metadata CAS made in turn with this owner's others; reads go to ``now`` from then
        on. False, changing nothing: it is no longer a closed ledger kept on ``was``.
        Returns once the old log is closed: reads in flight on it end on it first, waited
        for after the CAS, out of the metadata lock (under it, a slow read held the
        ledger's rollovers, trims and clean close as long as it lasted).

        Raises:
            LedgerClosed: this ledger object is closed.
            LedgerFenced: another process owns the ledger now.
        """
        if self._closing:
            raise LedgerClosed(f"{self.name} is closed")
        changed: list[LedgerMetadata] = []

        def move(meta: LedgerMetadata) -> LedgerMetadata | None:
            changed[:] = [] if (after := moved(meta, ledger_id, was, now)) is None else [after]
            return after

        closing: list[asyncio.Event] = []

        async def let_go(_: LedgerMetadata) -> None:  # run with the CAS (see _update)
            if (released := await self._logs.let_go(ledger_id)) is not None:
                closing.append(released)

        await self._update(move, landed=let_go)
        for released in closing:  # (not under the metadata lock: a slow read holds no change)
            await released.wait()
        return bool(changed)

    def _open_size(self, ledger_id: int) -> int:
        """The size of a ledger held open (0 if it is not)."""
        entry_log = self._logs.get(ledger_id)
        return entry_log.size_bytes() if entry_log is not None else 0
