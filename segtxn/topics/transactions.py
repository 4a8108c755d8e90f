"""PIP-471's transaction records in the metadata store: its schema, with op records per
transaction and segment (or subscription) instead of per append or ack, and ``cumulative``
acks (PIP-471 has no cumulative transactional ack; segtxn has, for ordered subscriptions).

```
/txn/<txnId>                               header {state, timeout_ms, created_ms, finalized_ms, ...}
/txn-op/<txnId>/w/<segment>                writes {segment, first, last}
/txn-op/<txnId>/a/<segment>/<sub>/<chunk>  acks   {segment, subscription, ranges, cumulative?}
idx writes-by-segment     (segment)               -> writes record
idx acks-by-segment-sub   (segment, subscription) -> acks record(s)
idx txn-by-deadline       (timeout_ms)            -> header, while OPEN
idx txn-by-final-state    (state, finalized_ms)   -> header, once final
```

A **writes** record says: the transaction's entries in this segment are those carrying its
id at positions ``first..last`` (minus recorded orphans). The participant rewrites it, with
a check that the header is still OPEN, whenever an append extends the range; one rewrite
covers every append that completed before it (docs/design-notes.md, "Op records per
transaction and segment"). An **acks** record holds a subscription's acknowledgements in the
transaction as ranges of entry ids per ledger, plus the cumulative position; a record that
holds :data:`MAX_ACKS_PER_RECORD` positions is left as it is and the next chunk starts.
Every record of a transaction has ``partition_key = txnId``; the indexes are kept by the
store in the same atomic step as their records. The coordinator writes headers, participants
(brokers) write op records. Both sides use these definitions, so they live below both.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

import msgspec

from segtxn.protocol.txn import TxnId, TxnState

HEADERS = "/txn/"
OPS = "/txn-op/"
IDX_WRITES = "writes-by-segment"
IDX_ACKS = "acks-by-segment-sub"
IDX_DEADLINE = "txn-by-deadline"
IDX_FINAL = "txn-by-final-state"

COORDINATOR_MEMBERS = "/txn-coordinators/members/"
"""One ephemeral record per live coordinator process (value: its URL): any of them can end
any v5 transaction, so clients list these, not just the id holders."""
COORDINATOR_ELECTIONS = "/segtxn/elections/txn-coordinator-"
"""Election keys of the v5 coordinator ids; each value is the holder's URL (lookups list
them so clients can find a coordinator)."""
V4_COORDINATOR_ELECTION = "txn-coordinator-v4-"
"""Election names of the v4 coordinator ids (``<name><most>``, under the store's elections
prefix); each leader record's value is the URL of the process holding that id and its
transaction log: brokers ask it whether a v4 transaction a client names is open
(segtxn/broker/txn/v4checks.py)."""


class TxnHeader(msgspec.Struct, frozen=True, omit_defaults=True):
    state: TxnState
    timeout_ms: int
    """Absolute epoch ms after which an OPEN transaction is aborted."""
    created_ms: int
    finalized_ms: int | None = None
    owner: str | None = None
    """The role that opened it (security on): only it or a superuser may add to, end or
    inspect it (docs/security.md). None: opened with security off."""
    trace: str | None = None
    """The ``traceparent`` of the END_TXN that decided it, when that call was traced:
    participants link their materialization spans to it (docs/tracing.md). Fields left at
    their defaults are not written, so a header without it reads as before."""


MAX_ACKS_PER_RECORD = 4096
"""Individually acknowledged positions per acks record (at most ~100 KB encoded even when no
two are adjacent; it is copied once into its index entry): a transaction acknowledging more
on one subscription goes on in a new chunk, so every store step stays far below the
store's request limit."""


class WritesRecord(msgspec.Struct, frozen=True, tag="writes", tag_field="kind"):
    segment: str
    first: tuple[int, int]
    last: tuple[int, int]
    """The transaction's entries here are those with its id in ``first..last``."""


class AckRange(msgspec.Struct, frozen=True, array_like=True):
    ledger_id: int
    first_entry: int
    last_entry: int


class AcksRecord(msgspec.Struct, frozen=True, tag="acks", tag_field="kind"):
    segment: str
    subscription: str
    ranges: list[AckRange]
    """Individually acknowledged entries, as inclusive runs of entry ids in one ledger."""
    cumulative: tuple[int, int] | None = None
    """Everything up to this position is acknowledged."""


OpRecord = WritesRecord | AcksRecord

encode = msgspec.json.Encoder().encode
decode_header = msgspec.json.Decoder(TxnHeader).decode
decode_op = msgspec.json.Decoder(OpRecord).decode


def header_key(txn: TxnId) -> str:
    return HEADERS + txn.key


def ops_prefix(txn: TxnId) -> str:
    return f"{OPS}{txn.key}/"


def writes_key(txn: TxnId, segment: str) -> str:
    return f"{ops_prefix(txn)}w/{quote(segment, safe='')}"


def acks_key(txn: TxnId, segment: str, subscription: str, chunk: int) -> str:
    names = f"{quote(segment, safe='')}/{quote(subscription, safe='')}"
    return f"{ops_prefix(txn)}a/{names}/{chunk:04d}"


def chunk_of_acks_key(key: str) -> int:
    return int(key.rsplit("/", 1)[1])


def txn_of_op_key(key: str) -> TxnId:
    """The transaction of ``/txn-op/<txnId>/...``."""
    return TxnId.from_key(key[len(OPS) :].split("/", 1)[0])


def txn_of_header_key(key: str) -> TxnId:
    return TxnId.from_key(key[len(HEADERS) :])


def header_indexes(header: TxnHeader) -> Mapping[str, int | tuple[str | int, ...]]:
    if header.state is TxnState.OPEN:
        return {IDX_DEADLINE: header.timeout_ms}
    return {IDX_FINAL: (header.state.value, header.finalized_ms or 0)}


def op_indexes(record: OpRecord) -> Mapping[str, str | tuple[str | int, ...]]:
    if isinstance(record, WritesRecord):
        return {IDX_WRITES: record.segment}
    return {IDX_ACKS: (record.segment, record.subscription)}
