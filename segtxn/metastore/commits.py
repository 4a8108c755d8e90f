"""How one atomic step of the metadata store is applied: its plan built into one engine
transaction on what the store's cache knows, read and tried again while it loses races, and
what it wrote learned into the cache (:class:`~segtxn.metastore.store.MetadataStore.commit`
is the contract)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from segtxn.metastore import keys as K
from segtxn.metastore.cache import ABSENT, KeyCache, Known
from segtxn.metastore.engine import Engine, GetOp
from segtxn.metastore.errors import StoreUnavailable
from segtxn.metastore.plan import Plan, Txn
from segtxn.metastore.records import Check, Delete, Record
from segtxn.metastore.settings import StoreSettings


class Commits:
    """The atomic steps of one store client (they share its cache)."""

    def __init__(self, cache: KeyCache, settings: StoreSettings) -> None:
        self._cache = cache
        self.settings = settings
        self._seq_locks = [asyncio.Lock() for _ in range(64)]

    async def apply(self, engine: Engine, plan: Plan) -> list[Record | None]:
        """Apply ``plan`` on ``engine`` (raising as ``MetadataStore.commit`` does).

        Sequential puts under one prefix are serialised within this client, so that they
        do not race each other for the prefix's counter (other clients still may; the
        counter's compare-and-set arbitrates)."""
        stripes = sorted({hash(p) % len(self._seq_locks) for p in plan.sequential_prefixes})
        async with contextlib.AsyncExitStack() as stack:
            for i in stripes:
                await stack.enter_async_context(self._seq_locks[i])
            return await self._commit_planned(engine, plan)

    async def _commit_planned(self, engine: Engine, plan: Plan) -> list[Record | None]:
        """Commit ``plan``, reading and trying again while it loses races.

        A race lost to a sequential number another client took is not counted against
        ``max_attempts`` (for ``request_timeout_s``): that client got somewhere, and the
        loser, whose view is always one write behind a client with more puts queued on
        the same prefix, would otherwise give up while the prefix is busy but healthy
        (tests/metastore/test_sequential.py: a client four writers kept one step ahead of).
        """
        attempts = fruitless = 0
        patient_until = time.monotonic() + self.settings.request_timeout_s
        while fruitless < self.settings.max_attempts:
            attempts += 1
            to_read = plan.must_read(self._cache.known)
            if to_read:
                result = await engine.txn([], [GetOp(raw) for raw in to_read])
                self._cache.learn_all(to_read, result.results)
                plan.raise_if_expectation_fails(self._cache.known, only=set(to_read))
            txn = plan.build(self._cache.known, self._cache.counters)
            result = await engine.txn(txn.compares, txn.success, txn.failure)
            if result.succeeded:
                return self._applied(plan, txn, result.revision)
            self._cache.learn_all(txn.compared, result.results)
            plan.raise_if_expectation_fails(self._cache.known)
            taken = self._skip_taken_sequence_numbers(plan, txn)
            if not (taken and time.monotonic() < patient_until):
                fruitless += 1
        raise StoreUnavailable(f"gave up after {attempts} attempts lost to concurrent writers")

    def _skip_taken_sequence_numbers(self, plan: Plan, txn: Txn) -> bool:
        """Move the counters past numbers another client took; whether there was one."""
        taken_any = False
        for step in plan.steps:
            if step.sequential:
                raw, _ = txn.written[id(step)]
                if self._cache.known.get(raw, ABSENT).mod:
                    taken = int(raw[len(step.raw) :])
                    self._cache.counters[step.raw] = max(
                        self._cache.counters.get(step.raw, 0), taken
                    )
                    taken_any = True
        return taken_any

    def _applied(self, plan: Plan, txn: Txn, revision: int) -> list[Record | None]:
        out: list[Record | None] = []
        for step in plan.steps:
            op = step.op
            if isinstance(op, Check):
                out.append(None)
                continue
            raw, before = txn.written[id(step)]
            if isinstance(op, Delete):
                self._cache.remember(raw, ABSENT)
                out.append(None)
                continue
            created = before.created if before.mod else revision
            self._cache.remember(raw, Known(revision, created, step.encoded))
            lease = op.session.lease_id if op.session else 0
            out.append(Record(raw.decode(), op.value, revision, created, step.indexes, lease))
        for prefix, last in txn.counters.items():
            self._cache.counters[prefix] = last
            self._cache.counters.move_to_end(prefix)
            self._cache.remember(K.sequence_counter_key(prefix), Known(revision, revision, {}))
        return out
