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

from urllib.parse import unquote

from segtxn.ledger.chain import LedgerChain
from segtxn.ledger.cursor import ManagedCursor, cursors_prefix
from segtxn.ledger.metadata import LedgerMetadata, decode, metadata_key
from segtxn.ledger.position import Position
from segtxn.metastore import MetadataStore


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
    for cursor in listing.records:
        cursor_name = unquote(cursor.key.rsplit("/", 1)[1])
        ledger.cursors[cursor_name] = ManagedCursor.restore(
            ledger=ledger,
            name=cursor_name,
            store=store,
            raw=cursor.value,
            version=cursor.version,
            max_persisted_ranges=max_persisted_ranges,
        )
    return ledger
