"""An id a v4 coordinator holds: its lease, its transaction log, a lock per transaction, and
the upkeep of that log. Once due, the log is compacted in the background. Once it failed a
write, it refuses every later one until it is opened again, so the id is given up: a
take-over (this coordinator's next campaign, or another's) reopens and replays the log.
Holding on, the id refused every call for good."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from segtxn.coordinator.retry import Retry, expected
from segtxn.coordinator.txnlog import TxnLog, TxnMeta
from segtxn.metastore import Leadership

log = logging.getLogger(__name__)

GIVE_UP_RETRY_S = 1.0
"""How often resigning an id whose log failed is tried again while the store fails too."""


@dataclass
class HeldLog:
    leadership: Leadership
    log: TxnLog
    counters: dict[str, int]
    """The coordinator's counters (compactions are counted there)."""
    locks: dict[int, asyncio.Lock] = field(default_factory=dict)
    giving_up: bool = False
    """Set once its log refused a write or its writer stopped: the id is being given up."""

    @property
    def txns(self) -> dict[int, TxnMeta]:
        return self.log.txns

    async def give_up(self) -> None:
        """Resign the id, tried again while it fails (:mod:`segtxn.coordinator.retry`):
        held on, the id refuses every call for good. (Only the store's errors were
        retried; any other one ended this, and the id stayed here, refusing.)"""
        retry = Retry("v4: giving up an id whose log failed", GIVE_UP_RETRY_S)
        while not self.leadership.lost.is_set():
            try:
                await self.leadership.resign()
                retry.reset()
            except Exception as e:
                await retry.after(e)  # the store is failing: a gentle pace

    async def compact(self) -> None:
        """Compact the log while it is due: again at once if what arrived during one
        compaction is enough for the next. A failure leaves the log correct; the next
        append retries. Any failure is counted and logged here (an unexpected one at ERROR
        with its traceback, as :func:`~segtxn.coordinator.retry.log_failure` does): nobody
        awaits this task, so an error let through would end it unseen ("Task exception was
        never retrieved", at best)."""
        while self.log.due and not self.leadership.lost.is_set():
            try:
                done, dropped = await self.log.compact()
            except Exception as e:
                self.counters["log_compaction_failures"] += 1
                ok = expected(e)
                log.log(
                    logging.WARNING if ok else logging.ERROR,
                    "v4 transaction log %s: compaction failed: %s: %s; the next append "
                    "starts another",
                    self.log.ledger.name, type(e).__name__, e,
                    exc_info=not ok,
                )  # fmt: skip
                return
            self.counters["log_compactions"] += 1
            self.counters["log_trimmed_ledgers"] += done.trimmed_ledgers
            self.counters["log_trimmed_entries"] += done.trimmed_entries
            self.counters["log_dropped_txns"] += dropped
            log.debug(
                "v4 transaction log %s: compacted: %d transactions kept, %d ended ones "
                "dropped, %d ledgers (%d entries) deleted",
                self.log.ledger.name, done.relogged, dropped, done.trimmed_ledgers,
                done.trimmed_entries,
            )  # fmt: skip
