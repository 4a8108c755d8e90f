"""PIP-471's transaction records in the metadata store: its schema, plus ``cumulative`` on an
ack op (PIP-471 has no cumulative transactional ack; segtxn has, for ordered subscriptions).

```
/txn/<txnId>              header {state, timeout_ms, created_ms, finalized_ms}
/txn-op/<txnId>/<seq>     op     {kind: write|ack, segment, subscription?, position, cumulative?}
idx writes-by-segment     (segment)               -> op, kind=write
idx acks-by-segment-sub   (segment, subscription) -> op, kind=ack
idx txn-by-deadline       (timeout_ms)            -> header, while OPEN
idx txn-by-final-state    (state, finalized_ms)   -> header, once final
```

Every record of a transaction has ``partition_key = txnId``; ``<seq>`` is store-assigned
(a sequential key); the indexes are kept by the store in the same atomic step as their
records. The coordinator writes headers, participants (brokers) write op records. Both sides
use these definitions, so they live below both.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

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


class TxnHeader(msgspec.Struct, frozen=True):
    state: TxnState
    timeout_ms: int
    """Absolute epoch ms after which an OPEN transaction is aborted."""
    created_ms: int
    finalized_ms: int | None = None


class OpKind(enum.StrEnum):
    WRITE = "write"
    ACK = "ack"


class TxnOp(msgspec.Struct, frozen=True):
    kind: OpKind
    segment: str
    position: tuple[int, int]
    subscription: str | None = None
    cumulative: bool = False
    """For an ack: the position acknowledges everything up to it."""


encode = msgspec.json.Encoder().encode
decode_header = msgspec.json.Decoder(TxnHeader).decode
decode_op = msgspec.json.Decoder(TxnOp).decode


def header_key(txn: TxnId) -> str:
    return HEADERS + txn.key


def ops_prefix(txn: TxnId) -> str:
    return f"{OPS}{txn.key}/"


def txn_of_op_key(key: str) -> TxnId:
    """The transaction of ``/txn-op/<txnId>/<seq>``."""
    return TxnId.from_key(key[len(OPS) :].split("/", 1)[0])


def txn_of_header_key(key: str) -> TxnId:
    return TxnId.from_key(key[len(HEADERS) :])


def header_indexes(header: TxnHeader) -> Mapping[str, int | tuple[str | int, ...]]:
    if header.state is TxnState.OPEN:
        return {IDX_DEADLINE: header.timeout_ms}
    return {IDX_FINAL: (header.state.value, header.finalized_ms or 0)}


def op_indexes(op: TxnOp) -> Mapping[str, str | tuple[str | int, ...]]:
    if op.kind is OpKind.WRITE:
        return {IDX_WRITES: op.segment}
    return {IDX_ACKS: (op.segment, op.subscription or "")}
