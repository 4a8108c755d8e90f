"""A sealed managed ledger read from the metadata store alone, without opening it.

A sealed managed ledger takes no more appends: its metadata record lists every ledger closed,
with its entry count, so what it holds is known without a file; its cursors' records say
what each subscription acknowledged. :func:`read_sealed` builds that view for questions
that need no entry — the last position, each cursor's mark and backlog — so a broker can
answer them for a sealed segment it has not loaded. Loading one only to answer them (a
scalable topic's stats asks every segment it ever had) kept every sealed segment loaded,
its files open and its state in memory, growing with the topic's history (issue 22).

The view is read-only: its cursors are never saved (nothing calls their ``ack``), and it is
a snapshot — a broker that loads the ledger meanwhile may move its cursors on.
"""

from __future__ import annotations

import contextlib

from segtxn.ledger.chain import LedgerChain
from segtxn.ledger.cursor import ManagedCursor, cursors_prefix, restore_cursors
from segtxn.ledger.identity import delete_chain
from segtxn.ledger.logs import LogStorage
from segtxn.ledger.metadata import LedgerMetadata, decode, metadata_key
from segtxn.ledger.position import Position
from segtxn.ledger.retention import NO_LIMIT, RetentionPolicy
from segtxn.metastore import MetadataStore, NotFound


class SealedLedger(LedgerChain):
    """The positions of a sealed managed ledger (:class:`LedgerChain`) and its cursors."""

    def __init__(self, name: str, meta: LedgerMetadata, version: int) -> None:
        self.name = name
        self._meta = meta
        self._version = version
        self._current = None
        self._last = None
        for info in reversed(meta.ledgers):
            if info.entries:
                self._last = Position(info.id, info.entries - 1)
                break
        self.cursors: dict[str, ManagedCursor] = {}

    def sealed_ms(self) -> int | None:
        """When it was sealed: its last ledger's close (None if not recorded)."""
        return self._meta.ledgers[-1].closed_ms if self._meta.ledgers else None

    def consumed(self) -> bool:
        """Every cursor's mark-delete position is at or past the last entry."""
        last = self.last_confirmed
        return last is None or all(c.mark_delete >= last for c in self.cursors.values())

    def released(self, policy: RetentionPolicy, now_ms: float) -> bool:
        """Whether retention lets all of it go: consumed by every cursor (with none, by
        time alone and only with a positive limit, as retention treats a ledger without
        cursors) and sealed at least ``retention_time_s`` ago. A size limit never releases
        a whole sealed ledger: only time does (-1: never)."""
        limit = policy.retention_time_s
        sealed = self.sealed_ms()
        if limit == NO_LIMIT or sealed is None or not self.consumed():
            return False
        if not self.cursors and limit <= 0:
            return False
        return now_ms - sealed >= limit * 1000


async def read_sealed(
    store: MetadataStore, name: str, *, max_persisted_ranges: int
) -> SealedLedger | None:
    """The managed ledger ``name`` as its records say, if it exists and is sealed; None
    otherwise (missing, or still taking appends: only its owner knows its last entry).

    Raises:
        MetadataStoreError: the store cannot be read.
    """
    record = await store.get(metadata_key(name))
    if record is None:
        return None
    meta = decode(record.value)
    if not meta.sealed:
        return None
    ledger = SealedLedger(name, meta, record.version)
    listing = await store.list_prefix(cursors_prefix(name))
    ledger.cursors = restore_cursors(
        ledger, store, listing.records, max_persisted_ranges=max_persisted_ranges
    )
    return ledger


async def delete_sealed(store: MetadataStore, storage: LogStorage, ledger: SealedLedger) -> None:
    """Delete a sealed managed ledger that is not open anywhere: its logs, then its
    cursors and its metadata record (idempotent: a delete a crash interrupted is finished
    by doing it again, and the record goes last so that what is left can still be found).

    Raises:
        LedgerMismatch: a file is not its ledger's (a foreign volume): nothing was deleted.
    """
    await delete_chain(ledger.name, storage, ledger.ledgers, ledger._meta.next_ledger_id)
    await store.delete_range(cursors_prefix(ledger.name))
    with contextlib.suppress(NotFound):
        await store.delete(metadata_key(ledger.name))
