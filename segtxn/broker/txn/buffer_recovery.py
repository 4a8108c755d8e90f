"""Reading back, at a segment's load, what its v5 transaction buffer recorded in the store
(the records of :mod:`segtxn.broker.txn.buffer_records`): its resolved watermark, its
aborted index and the writes records of the transactions that wrote to it.

The contract: :func:`read_recorded` reads, and changes nothing, in the store or in memory; a
writes record it cannot decode is logged at ERROR and passed over (its entries are then
found by the orphan scan, never shown). What the records mean (which entries they show,
and which transactions are still open) is the buffer's to decide
(:meth:`segtxn.broker.txn.buffer.MetadataTransactionBuffer.recover`), as are the orphans
(:class:`segtxn.broker.txn.orphans.Orphans`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from urllib.parse import quote

import msgspec

from segtxn.broker.metrics import BrokerMetrics
from segtxn.broker.txn.buffer_records import (
    ABORTED,
    STATE,
    AbortedTxn,
    BufferState,
    WritesDraft,
    as_position,
)
from segtxn.ledger import Position
from segtxn.metastore import MetadataStore
from segtxn.protocol.txn import TxnId
from segtxn.topics import transactions as T

log = logging.getLogger(__name__)


@dataclass
class Recorded:
    """What a segment's transaction buffer found recorded for it."""

    watermark: Position | None = None
    """The durable resolved watermark (None: none written yet)."""
    aborted: dict[TxnId, AbortedTxn] = field(default_factory=dict)
    records: dict[TxnId, WritesDraft] = field(default_factory=dict)
    """The writes records still in the store, each as landed (its range durable)."""


def state_key(segment: str) -> str:
    """The key of ``segment``'s resolved watermark."""
    return STATE + quote(segment, safe="")


def aborted_prefix(segment: str) -> str:
    """The prefix of ``segment``'s aborted index."""
    return f"{ABORTED}{quote(segment, safe='')}/"


async def read_recorded(store: MetadataStore, segment: str, metrics: BrokerMetrics) -> Recorded:
    """Read ``segment``'s watermark, aborted index and writes records (the index query's
    time recorded in ``metrics``).

    Raises:
        MetadataStoreError: the store could not be read.
    """
    found = Recorded()
    record = await store.get(state_key(segment))
    if record is not None:
        saved = msgspec.json.decode(record.value, type=BufferState).watermark
        found.watermark = None if saved is None else as_position(saved)
    aborted = await store.list_prefix(aborted_prefix(segment))
    for item in aborted.records:
        txn = TxnId.from_key(item.key.rsplit("/", 1)[1])
        found.aborted[txn] = msgspec.json.decode(item.value, type=AbortedTxn)
    started = time.perf_counter()
    ops = await store.index_range(T.IDX_WRITES, segment)
    metrics.txn_index_query.record(time.perf_counter() - started)
    for op in ops.entries:
        txn = T.txn_of_op_key(op.key)
        try:
            written = T.decode_op(op.value)
        except msgspec.DecodeError as e:
            log.error("%s: op record %s unreadable (%s): ignored", segment, op.key, e)
            continue
        if isinstance(written, T.WritesRecord):
            found.records[txn] = WritesDraft.recovered(txn, written)
    return found
