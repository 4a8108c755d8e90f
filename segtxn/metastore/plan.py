"""The plan of one atomic step: a commit's operations, checked once, then turned into one
engine transaction per attempt.

:meth:`MetadataStore.commit <segtxn.metastore.store.MetadataStore.commit>` validates its
operations once (:meth:`Plan.validate`); then, on each attempt, it reads the keys whose
state it must know for sure (:meth:`Plan.must_read`), builds one transaction that compares
the ``mod_revision`` of every key it touches and writes each record with its index entries
and the sequence counters (:meth:`Plan.build`), and, if a compare fails, raises the error of
the first unmet expectation (:meth:`Plan.raise_if_expectation_fails`) or tries again. What
a plan assumes about a key comes from the store's cache (:mod:`segtxn.metastore.cache`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from segtxn.metastore import keys as K
from segtxn.metastore.cache import ABSENT, Known
from segtxn.metastore.engine import (
    MAX_REQUEST_BYTES,
    MAX_TXN_OPS,
    Compare,
    DeleteOp,
    GetOp,
    ModEquals,
    PutOp,
    TxnOp,
)
from segtxn.metastore.errors import (
    AlreadyExists,
    BadVersion,
    InvalidArgument,
    NotFound,
    TooLarge,
    TooManyOperations,
)
from segtxn.metastore.records import MUST_NOT_EXIST, Check, Delete, Op, Put
from segtxn.metastore.settings import StoreSettings


@dataclass(eq=False)
class Step:
    """One operation of the step, with its physical key and its normalized index keys."""

    op: Op
    raw: bytes  # the physical key (the prefix, for a sequential put)
    indexes: dict[str, K.IndexKey]
    encoded: dict[str, bytes]
    """``indexes`` encoded (:func:`~segtxn.metastore.keys.encode_index_key`), once: every
    attempt's transaction and the record learned after it use them."""

    @property
    def sequential(self) -> bool:
        return isinstance(self.op, Put) and self.op.sequential


@dataclass
class Txn:
    """One attempt's engine transaction, and what it writes (the store learns from it)."""

    compares: list[Compare]
    success: list[TxnOp]
    failure: list[TxnOp]
    compared: list[bytes]
    written: dict[int, tuple[bytes, Known]]  # id(step) -> (physical key, state before)
    counters: dict[bytes, int]  # prefix -> last number assigned


class Plan:
    """A validated atomic step, turned into one engine transaction per attempt."""

    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps
        self.sequential_prefixes = sorted({s.raw for s in steps if s.sequential})

    @classmethod
    def validate(cls, ops: Sequence[Op], settings: StoreSettings) -> Plan:
        steps: list[Step] = []
        seen: set[bytes] = set()
        for op in ops:
            if not isinstance(op, Put | Delete | Check):
                raise InvalidArgument(f"not a store operation: {op!r}")
            sequential = isinstance(op, Put) and op.sequential
            raw = K.check_key(op.key, what="prefix" if sequential else "key")
            if op.expected_version is not None and op.expected_version < 0:
                raise InvalidArgument("expected_version must be >= 0")
            if isinstance(op, Delete) and op.expected_version == MUST_NOT_EXIST:
                raise InvalidArgument("a delete cannot expect the key not to exist")
            indexes, encoded = cls._validate_put(op, settings) if isinstance(op, Put) else ({}, {})
            if not sequential:
                if raw in seen:
                    raise InvalidArgument(f"key {op.key!r} appears twice in one atomic step")
                seen.add(raw)
            steps.append(Step(op, raw, indexes, encoded))
        return cls(steps)

    @staticmethod
    def _validate_put(
        op: Put, settings: StoreSettings
    ) -> tuple[dict[str, K.IndexKey], dict[str, bytes]]:
        if not isinstance(op.value, bytes):
            raise InvalidArgument(f"value for {op.key!r} must be bytes")
        if len(op.value) > settings.max_value_bytes:
            raise TooLarge(
                f"value for {op.key!r} is {len(op.value)} bytes; "
                f"the limit is {settings.max_value_bytes}"
            )
        if op.sequential and op.expected_version is not None:
            raise InvalidArgument("a sequential put always creates: no expected_version")
        if op.partition_key is not None and not isinstance(op.partition_key, str):
            raise InvalidArgument("partition_key must be a str")
        if op.session is not None:
            op.session.check()
        indexes: dict[str, K.IndexKey] = {}
        encoded: dict[str, bytes] = {}
        for name, ikey in (op.indexes or {}).items():
            K.check_index_name(name)
            indexes[name] = K.normalize_index_key(ikey)
            encoded[name] = K.encode_index_key(indexes[name])
        return indexes, encoded

    def must_read(self, known: Mapping[bytes, Known]) -> list[bytes]:
        """Keys whose current state (and index entries) the step must know for sure:
        deletes, and compare-and-sets whose expected version the cache does not hold."""
        out = []
        for step in self.steps:
            op = step.op
            if isinstance(op, Delete) and op.expected_version is None:
                # a cached absence is no proof: the delete must report NotFound truthfully
                if known.get(step.raw, ABSENT).mod == 0:
                    out.append(step.raw)
            elif isinstance(op, Put | Delete) and (op.expected_version or 0) > 0:
                state = known.get(step.raw)
                if state is None or state.mod != op.expected_version:
                    out.append(step.raw)
        return out

    def build(self, known: Mapping[bytes, Known], counter_values: Mapping[bytes, int]) -> Txn:
        txn = Txn([], [], [], [], {}, {})
        size = 0

        def compare(raw: bytes, mod: int) -> None:
            txn.compares.append(ModEquals(raw, mod))
            txn.compared.append(raw)

        for prefix in self.sequential_prefixes:
            counter_key = K.sequence_counter_key(prefix)
            compare(counter_key, known.get(counter_key, ABSENT).mod)
            txn.counters[prefix] = counter_values.get(prefix, 0)

        for step in self.steps:
            op = step.op
            if isinstance(op, Check):
                compare(step.raw, op.expected_version)
                continue
            if isinstance(op, Put) and op.sequential:
                txn.counters[step.raw] += 1
                raw = K.sequential_key(op.key, txn.counters[step.raw]).encode()
                state = ABSENT
                compare(raw, 0)  # never overwrite: a counter reset must not reuse a key
            else:
                raw = step.raw
                state = known.get(raw, ABSENT)
                if op.expected_version == MUST_NOT_EXIST:
                    state = ABSENT
                compare(raw, state.mod)
            txn.written[id(step)] = (raw, state)
            old = {K.index_entry_key(n.encode(), ik, raw) for n, ik in state.indexes.items()}
            if isinstance(op, Delete):
                txn.success.append(DeleteOp(raw))
                txn.success += [DeleteOp(e) for e in sorted(old)]
                continue
            lease = op.session.lease_id if op.session else 0
            new = {K.index_entry_key(n.encode(), ik, raw) for n, ik in step.encoded.items()}
            txn.success.append(PutOp(raw, K.pack_value(op.value, step.encoded), lease))
            txn.success += [PutOp(e, op.value, lease) for e in sorted(new)]
            txn.success += [DeleteOp(e) for e in sorted(old - new)]
            size += len(raw) + len(op.value) * (1 + len(new)) + sum(map(len, new))

        for prefix, last in txn.counters.items():
            txn.success.append(PutOp(K.sequence_counter_key(prefix), str(last).encode()))

        if len(txn.success) > MAX_TXN_OPS or len(txn.compares) > MAX_TXN_OPS:
            raise TooManyOperations(
                f"this atomic step needs {len(txn.success)} physical operations and "
                f"{len(txn.compares)} compares; the limit is {MAX_TXN_OPS} each "
                "(a record counts 1, plus 1 per index entry written or removed)"
            )
        if size > MAX_REQUEST_BYTES:
            raise TooLarge(
                f"this atomic step writes {size} bytes; the limit is {MAX_REQUEST_BYTES} "
                "(an indexed value is copied into each of its index entries)"
            )
        txn.failure = [GetOp(raw) for raw in txn.compared]
        return txn

    def raise_if_expectation_fails(
        self, known: Mapping[bytes, Known], only: set[bytes] | None = None
    ) -> None:
        """Given what the store just learned, raise the error of the first unmet
        expectation. ``only`` limits the check to freshly read keys: for the others the
        cache is a guess, and the transaction's compares decide."""
        for step in self.steps:
            op = step.op
            if step.sequential or (only is not None and step.raw not in only):
                continue
            actual = known.get(step.raw, ABSENT).mod
            expected = op.expected_version
            if expected is None:
                if isinstance(op, Delete) and actual == 0 and step.raw in known:
                    raise NotFound(op.key)
                continue
            if expected == actual:
                continue
            if expected == MUST_NOT_EXIST:
                raise AlreadyExists(op.key, actual)
            if actual == 0:
                raise NotFound(op.key)
            raise BadVersion(op.key, expected, actual)
