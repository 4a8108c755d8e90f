"""Deleting a key range with its index entries: the engine-level work behind
:meth:`segtxn.metastore.store.MetadataStore.delete_range` (see its contract).

A range is read in chunks; each chunk's records go with their index entries in one
transaction, compared against the revisions just read, so a record never disappears
without its index entries or the reverse. A chunk that lost a race to a writer is read
again (up to ``max_attempts`` times in a row).

Once the range reads empty, the sequence counters of the prefixes it covers go too, each
only on condition that its prefix is still empty: a sequential put that lands between the
two steps survives, and so must its counter, or the next put under the prefix would be
numbered from 1 again, below the survivor (sequential keys must increase)."""

from __future__ import annotations

from segtxn.metastore import keys as K
from segtxn.metastore.cache import ABSENT, KeyCache
from segtxn.metastore.engine import (
    MAX_TXN_OPS,
    Compare,
    DeleteOp,
    Engine,
    KeyValue,
    ModEquals,
    RangeUnchangedSince,
    TxnOp,
)
from segtxn.metastore.errors import StoreUnavailable


async def delete_range(
    engine: Engine, cache: KeyCache, lo: bytes, hi: bytes, max_attempts: int
) -> int:
    """Delete every record in ``[lo, hi)`` with its index entries, then the sequence
    counters of the prefixes the range covers and that are still empty; returns how many
    records went.

    Raises:
        StoreUnavailable: ``max_attempts`` chunks in a row lost to concurrent writers.
        MetadataStoreError: the store failed (what was deleted stays deleted).
    """
    deleted = failures = 0
    while True:
        result = await engine.range(lo, hi, limit=MAX_TXN_OPS)
        if not result.kvs:
            break  # empty at result.revision
        chosen: list[tuple[KeyValue, list[bytes]]] = []
        ops = 0
        for kv in result.kvs:
            _, indexes = K.unpack_value(kv.value)
            entries = [K.index_entry_key(n.encode(), ik, kv.key) for n, ik in indexes.items()]
            if chosen and ops + 1 + len(entries) > MAX_TXN_OPS:
                break
            chosen.append((kv, entries))
            ops += 1 + len(entries)
        index_ops: list[TxnOp] = [DeleteOp(e) for _, entries in chosen for e in entries]
        compares: list[Compare]
        if not result.more and len(chosen) == len(result.kvs) and len(index_ops) < MAX_TXN_OPS:
            # the whole range fits in one step
            compares = [RangeUnchangedSince(lo, hi, result.revision)]
            success: list[TxnOp] = [DeleteOp(lo, hi), *index_ops]
        else:
            compares = [ModEquals(kv.key, kv.mod_revision) for kv, _ in chosen]
            success = [DeleteOp(kv.key) for kv, _ in chosen] + index_ops
        txn = await engine.txn(compares, success)
        if not txn.succeeded:  # something in the range changed under us: read it again
            failures += 1
            if failures >= max_attempts:
                raise StoreUnavailable(
                    f"delete_range gave up after {failures} attempts lost to writers"
                )
            continue
        failures = 0
        for kv, _ in chosen:
            cache.remember(kv.key, ABSENT)
        deleted += len(chosen)
    await _delete_counters(engine, cache, lo, hi, result.revision)
    return deleted


async def _delete_counters(
    engine: Engine, cache: KeyCache, lo: bytes, hi: bytes, empty_at: int
) -> None:
    """Forget the sequence counters of prefixes whose whole key range is in [lo, hi) and
    has had no write since ``empty_at``, a revision at which [lo, hi) was read empty: a
    prefix written since holds a key numbered by its counter, which must stay (see the
    module docstring). A chunk refused for one busy prefix is done again prefix by prefix.
    """
    found = await engine.range(K.sequence_counter_key(lo), K.sequence_counter_key(hi))
    root = len(K.SEQUENCE_ROOT)
    covered = [kv.key for kv in found.kvs if K.prefix_end(kv.key[root:]) <= hi]
    for i in range(0, len(covered), MAX_TXN_OPS):
        chunk = covered[i : i + MAX_TXN_OPS]
        if await _delete_if_still_empty(engine, cache, chunk, empty_at) or len(chunk) == 1:
            continue
        for key in chunk:
            await _delete_if_still_empty(engine, cache, [key], empty_at)


async def _delete_if_still_empty(
    engine: Engine, cache: KeyCache, counters: list[bytes], empty_at: int
) -> bool:
    """Delete ``counters`` in one step if none of their prefixes has had a write since
    ``empty_at``; whether they went."""
    root = len(K.SEQUENCE_ROOT)
    empty: list[Compare] = [
        RangeUnchangedSince(k[root:], K.prefix_end(k[root:]), empty_at) for k in counters
    ]
    if not (await engine.txn(empty, [DeleteOp(k) for k in counters])).succeeded:
        return False
    for key in counters:
        cache.counters.pop(key[root:], None)
        cache.known.pop(key, None)
    return True
