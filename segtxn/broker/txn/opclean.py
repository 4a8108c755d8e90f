"""Clean-up of op records after outcomes, batched across the broker.

What a segment or subscription hands to :meth:`OpRecordCleaner.clean` (index entries and a
watermark to put, then records to delete) waits up to :data:`CLEAN_LINGER_S` for others,
and they go together in one store step: it is off every client's path (visibility comes
from the header cache, not from the clean-up), so it is batched for the store's sake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from segtxn.failures import retry_warning
from segtxn.metastore import Delete, MetadataStore, MetadataStoreError, NotFound, Op, Put

CLEAN_LINGER_S = 0.25
"""How long clean-up waits for more to go in the same store step."""
CLEAN_OPS_PER_STEP = 40
"""Puts and deletes per clean-up step (a delete of an indexed record counts two physical
operations, as does a put: under the 128 a step may hold)."""
CLEAN_RETRY_S = 1.0
DELETES_PER_STEP = 40
"""Records deleted per store step when they go on their own."""
log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Cleaning:
    puts: list[Put]
    deletes: list[str]
    done: asyncio.Future[None] | None
    """None: nobody waits (retried until it lands)."""

    @property
    def size(self) -> int:
        return len(self.puts) + len(self.deletes)

    @property
    def keys(self) -> set[str]:
        return {p.key for p in self.puts} | set(self.deletes)


class OpRecordCleaner:
    """The broker's one queue of op-record clean-up (see the module docstring)."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._cleaning: list[_Cleaning] = []
        self._cleaner: asyncio.Task[None] | None = None
        self._closed = False

    async def clean(self, puts: list[Put], deletes: list[str]) -> None:
        """Write ``puts``, then delete the records ``deletes`` (one already gone is not an
        error), batched with other clean-up of this broker: in one atomic step when they
        fit, else the puts first.

        Raises:
            MetadataStoreError: the store failed (nothing, or the puts only, were done).
        """
        done = asyncio.get_running_loop().create_future()
        self._enqueue(_Cleaning(puts, deletes, done))
        await asyncio.shield(done)

    def discard(self, deletes: list[str]) -> None:
        """Delete the records ``deletes`` soon, retrying while the store fails (nobody
        waits: a subscription's next materialization must not wait for the last one's)."""
        if deletes:
            self._enqueue(_Cleaning([], deletes, None))

    def _enqueue(self, cleaning: _Cleaning) -> None:
        if self._closed:  # left for the next load to find (materializing is idempotent)
            if cleaning.done is not None:
                cleaning.done.cancel()
            return
        self._cleaning.append(cleaning)
        if self._cleaner is None:
            self._cleaner = asyncio.create_task(self._clean_loop(), name="op-records-clean")

    async def _clean_loop(self) -> None:
        try:
            while self._cleaning:
                await asyncio.sleep(CLEAN_LINGER_S)  # let more arrive: one step for them all
                batch: list[_Cleaning] = []
                keys: set[str] = set()
                while self._cleaning:
                    nxt = self._cleaning[0]
                    size = sum(c.size for c in batch) + nxt.size
                    if batch and (size > CLEAN_OPS_PER_STEP or keys & nxt.keys):
                        break  # a step touches a key once
                    batch.append(self._cleaning.pop(0))
                    keys |= nxt.keys
                try:
                    await self._clean_step(batch)
                except Exception as e:  # a bug: tell the waiters rather than leave them hanging
                    log.exception("op-record clean-up failed")
                    for cleaning in batch:
                        if cleaning.done is not None and not cleaning.done.done():
                            cleaning.done.set_exception(e)
                            cleaning.done.exception()
        finally:
            self._cleaner = None

    async def _clean_step(self, batch: list[_Cleaning]) -> None:
        try:
            if sum(c.size for c in batch) <= CLEAN_OPS_PER_STEP:
                ops: list[Op] = [op for c in batch for op in c.puts]
                ops += [Delete(key) for c in batch for key in c.deletes]
                try:
                    await self._store.commit(ops)
                except NotFound:  # a record is gone already: each on its own
                    for cleaning in batch:
                        await self._clean_alone(cleaning)
            else:  # one too large for a step
                for cleaning in batch:
                    await self._clean_alone(cleaning)
        except MetadataStoreError as e:
            for cleaning in batch:
                if cleaning.done is None:  # nobody waits: try again later
                    retry_warning(log, e, "op-record clean-up failed (%s); retrying", e)
                    asyncio.get_running_loop().call_later(CLEAN_RETRY_S, self._enqueue, cleaning)
                elif not cleaning.done.done():
                    cleaning.done.set_exception(e)
                    cleaning.done.exception()  # retrieved: the waiter re-raises it
            return
        for cleaning in batch:
            if cleaning.done is not None and not cleaning.done.done():
                cleaning.done.set_result(None)

    async def _clean_alone(self, cleaning: _Cleaning) -> None:
        for start in range(0, len(cleaning.puts), CLEAN_OPS_PER_STEP):
            await self._store.commit(cleaning.puts[start : start + CLEAN_OPS_PER_STEP])
        await _delete_records(self._store, cleaning.deletes)

    async def close(self) -> None:
        """Stop; what is still queued is left for the next load to find (materializing is
        idempotent)."""
        self._closed = True
        if self._cleaner is not None:
            self._cleaner.cancel()
            await asyncio.gather(self._cleaner, return_exceptions=True)


async def _delete_records(store: MetadataStore, keys: Sequence[str]) -> None:
    """Delete op records, up to :data:`DELETES_PER_STEP` per store step; a record
    already gone (the coordinator force-deletes abandoned ones) is not an error.

    Raises:
        MetadataStoreError: the store failed (some may be deleted, the rest are not).
    """
    for start in range(0, len(keys), DELETES_PER_STEP):
        chunk = keys[start : start + DELETES_PER_STEP]
        try:
            await store.commit([Delete(key) for key in chunk])
        except NotFound:  # one of them is gone: the others one by one
            for key in chunk:
                with contextlib.suppress(NotFound):
                    await store.delete(key)
