"""How much of a ``send_batch`` of plain sends one task publishes: all of it, or runs of
:data:`RUN` while its producer is the only one publishing on the broker.

A batch published whole (one ``Publishing.publish_plain``) is queued on its ledger once
every send of it has been admitted and queued; only then does the ledger's write and
``fdatasync`` start, and the receipts go back together. One producer that keeps its window
full (the client's ``send_async`` loop) then runs in lock-step: its CPU, the broker's CPU
for the whole batch, the sync, one after the other, and neither process keeps a core busy.
Published in runs of :data:`RUN` with a yield after each run is started, the ledger syncs
the first run while the broker takes in the next, and the first receipts free the client's
window sooner: one producer's throughput rose by about a quarter (bench/broker.py, 1
producer with batching, medians of alternating runs; docs/design-notes.md, 23).

When other producers publish on the broker too, their work already fills the time of each
sync: runs then only add syncs, tasks and receipt frames, and eight producers lost about a
tenth of their throughput to them (bench/broker.py). Counting the batches in flight at the
moment one arrives was not enough to tell: eight producers in lock-step with the broker
often find none of the others' batches in flight, and a twelfth of their batches were still
split, for the same loss. So a batch is split only once no other connection has published
on the broker for :data:`ALONE_AFTER_S`: a producer alone, as the lock-step case is.

Transactional sends are never split: the transaction buffer records one run of them with
one rewrite of the transaction's op records, and runs would multiply those store steps.
Splitting changes what a producer sees only as single sends already may: every send still
takes its turn in arrival order and gets its own receipt (segtxn/broker/ordering.py), and a
write that fails for one run leaves a gap inside the batch, never an inversion, as a failed
single send does (docs/protocol.md, "Order").
"""

from __future__ import annotations

import time

RUN = 250
"""Plain sends per task of a batch published in runs. Runs of 100 cost more broker CPU per
message than 250 for no more throughput (bench/broker.py, one producer)."""

ALONE_AFTER_S = 1.0
"""How long no other connection may have published before a connection's batches are split:
many round trips of a producer in lock-step (tens of milliseconds each), so producers
publishing together are never taken for one alone."""


class Intake:
    """Which connection published last on one broker, and since when others did not (one
    per broker service)."""

    __slots__ = ("_alone_after_s", "_last", "_shared_at")

    def __init__(self, alone_after_s: float = ALONE_AFTER_S) -> None:
        self._alone_after_s = alone_after_s
        self._last: int | None = None
        self._shared_at = 0.0
        """When a connection other than the last one published (monotonic seconds)."""

    def publishing(self, connection: int) -> None:
        """Note that ``connection`` (a number identifying it) is publishing sends now."""
        if connection != self._last:
            self._last = connection
            self._shared_at = time.monotonic()

    def run_size(self, sends: int, *, transactional: bool, connection: int) -> int:
        """How many of ``sends`` (a batch ``connection`` just sent) to publish per task: all
        of them, or :data:`RUN` when they are plain and only ``connection`` has published
        on the broker for :data:`ALONE_AFTER_S` (a connection's first batch is whole)."""
        if transactional or connection != self._last:
            return sends
        if time.monotonic() - self._shared_at < self._alone_after_s:
            return sends
        return RUN
