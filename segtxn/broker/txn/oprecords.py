"""Writing op records, several per store step.

Every transactional send and ack writes one op record under ``/txn-op/<txnId>/``. They are
sequential keys of one prefix, so a store client writes them one step at a time; written
one by one they bound a transaction's throughput (bench/txn.py measured ~1 ms each). This
writer combines: while a step for a transaction is in flight, the op records that arrive
for the same transaction — from any segment or subscription on this broker — queue up and
go together in the next step, up to :data:`MAX_OPS_PER_STEP`, with one check that the
header is still at the version it had while OPEN. A failed step fails every record in it,
which is exactly the outcome each would have had alone (the header check is shared).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from segtxn.broker.metrics import BrokerMetrics
from segtxn.metastore import BadVersion, Check, MetadataStore, MetadataStoreError, NotFound, Put
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnId
from segtxn.topics import transactions as T

MAX_OPS_PER_STEP = 40
"""Each op record costs the store three physical writes (record, index entry, and its
share of the sequence counter); 40 leave room under the 128 a step may hold."""


@dataclass(eq=False)
class _Queued:
    op: T.TxnOp
    version: int
    done: asyncio.Future[str] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class OpRecordWriter:
    def __init__(self, store: MetadataStore, metrics: BrokerMetrics) -> None:
        self._store = store
        self._metrics = metrics
        self._queues: dict[TxnId, list[_Queued]] = {}
        self._flushers: dict[TxnId, asyncio.Task[None]] = {}

    async def write(self, txn: TxnId, version: int, op: T.TxnOp) -> str:
        """Write one op record if the header is still at ``version``; returns its key.

        Raises:
            ServerError(TransactionConflict): the transaction ended meanwhile.
            ServerError(PersistenceError): the store failed (the record may not exist).
        """
        queued = _Queued(op, version)
        self._queues.setdefault(txn, []).append(queued)
        if txn not in self._flushers:
            self._flushers[txn] = asyncio.create_task(self._flush(txn), name=f"op-records-{txn}")
        return await asyncio.shield(queued.done)

    async def _flush(self, txn: TxnId) -> None:
        try:
            while self._queues.get(txn):
                queue = self._queues[txn]
                batch, self._queues[txn] = queue[:MAX_OPS_PER_STEP], queue[MAX_OPS_PER_STEP:]
                await self._step(txn, batch)
        finally:
            self._queues.pop(txn, None)
            self._flushers.pop(txn, None)

    async def _step(self, txn: TxnId, batch: list[_Queued]) -> None:
        puts = [
            Put(
                T.ops_prefix(txn),
                T.encode(q.op),
                sequential=True,
                partition_key=txn.key,
                indexes=T.op_indexes(q.op),
            )
            for q in batch
        ]
        error: ServerError | None = None
        try:
            results = await self._store.commit([Check(T.header_key(txn), batch[0].version), *puts])
        except (BadVersion, NotFound) as e:
            error = ServerError(ErrorName.TRANSACTION_CONFLICT, f"{txn} ended meanwhile")
            error.__cause__ = e
        except MetadataStoreError as e:
            error = ServerError(ErrorName.PERSISTENCE, f"could not record the op: {e}")
            error.__cause__ = e
        if error is not None:
            for queued in batch:
                queued.done.set_exception(error)
                queued.done.exception()  # retrieved: the waiter re-raises its own copy
            return
        for queued, record in zip(batch, results[1:], strict=True):
            if record is None:  # a Put always yields its record
                queued.done.set_exception(ServerError(ErrorName.UNKNOWN, "no op record"))
            else:
                queued.done.set_result(record.key)
                self._metrics.txn_op_writes.add(1, {"kind": queued.op.kind.value})

    async def close(self) -> None:
        tasks = list(self._flushers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
