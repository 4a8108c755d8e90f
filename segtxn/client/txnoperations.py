"""A transaction's operations, as the transaction sees them: the sends and acknowledgments in
flight (``commit`` waits for them), the first failure among them, which *poisons* the
transaction (its commit aborts it instead), and whom to tell when it ends without a commit
(consumers, to have what they acknowledged in it delivered again). Producers and consumer
streams report each operation here (:meth:`Operations.track`); how a refused or cancelled
one poisons it: :mod:`segtxn.client.poisoning`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from segtxn.aio import callbacks_context
from segtxn.client.errors import ClientError, OperationCancelled, Timeout
from segtxn.client.onestep import Placements
from segtxn.client.timeouts import Deadline
from segtxn.protocol.errors import ErrorCategory, ServerError

log = logging.getLogger(__name__)


class Operations:
    def __init__(self, placements: Placements | None, name: Callable[[], str]) -> None:
        """``placements``: where each operation is written, for the one-step commit (None:
        off); ``name``: the transaction's, for messages (its id once it has one)."""
        self._placements = placements
        self._name = name
        self.in_flight: set[asyncio.Future[Any]] = set()
        self.failure: BaseException | None = None
        """The first failure of an operation in it: set, the transaction cannot commit."""
        self._on_failure: dict[object, Callable[[], Awaitable[None]]] = {}
        self._callbacks = callbacks_context()

    def track(self, future: asyncio.Future[Any]) -> None:
        """Count an operation in the transaction: if it fails, or is cancelled (its outcome
        is then unknown), the transaction fails."""
        self.in_flight.add(future)
        if self._placements is not None:
            self._placements.tracking(future)
        future.add_done_callback(self._settled, context=self._callbacks)

    @contextlib.contextmanager
    def joining(self) -> Iterator[None]:
        """Count, while the block runs, an operation joining the transaction: opening it
        (NEW_TXN), registering its topic (a v4 ADD_PARTITION / ADD_SUBSCRIPTION), or a
        send on its way to being tracked (from its call: waiting for room in its
        producer's window included). Its end (``commit``, ``abort``) waits for the join,
        then for the operation the join lets through, which is tracked on its way out of
        the block (:meth:`settle` waits for operations tracked meanwhile too). Without it
        an end saw nothing in flight and went ahead: a commit of a transaction being
        opened committed nothing while its coordinator kept what it opened OPEN until its
        timeout, and a v4 commit left out a send still registering, or waiting for room.
        A failed join is the operation's failure (it poisons the transaction itself), so
        the block's own outcome is not kept here."""
        joined: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.in_flight.add(joined)
        try:
            yield
        finally:
            self.in_flight.discard(joined)
            joined.set_result(None)

    def _settled(self, future: asyncio.Future[Any]) -> None:
        self.in_flight.discard(future)
        if self._placements is not None:
            self._placements.settled(future)
        if future.cancelled():
            self.poison(
                OperationCancelled(
                    f"an operation in transaction {self._name()} was cancelled by its caller "
                    "before its answer came: whether the broker applied it is unknown"
                )
            )
        elif (error := future.exception()) is not None:
            self.poison(error)

    def poison(self, error: BaseException) -> None:
        """Mark the transaction failed (its commit will abort)."""
        if self.failure is None:
            self.failure = error

    async def settle(self, deadline: Deadline) -> bool:
        """Wait, until ``deadline``, for the operations in flight, those tracked meanwhile
        included (an operation that was joining the transaction is tracked as its join
        ends); False if some are not done by then."""
        while self.in_flight:
            _, late = await asyncio.wait(set(self.in_flight), timeout=deadline.remaining())
            if late:
                return False
        return True

    def late(self, deadline: Deadline) -> Timeout:
        """The error of a commit whose operations (or the transaction's start) were not
        done by ``deadline``: it did not commit, and it is poisoned (they may land later,
        and it must not then commit without the ones that did not)."""
        late = Timeout(
            f"transaction {self._name()}: {len(self.in_flight)} operations not done within "
            f"{deadline}; it was not committed",
            category=ErrorCategory.ABORTABLE,
        )
        self.poison(late)
        return late

    def on_failure(self, key: object, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` (once per ``key``) if the transaction ends without a commit:
        aborted, refused, or with an outcome unknown. Consumers use it to have what they
        acknowledged in it delivered again, in order."""
        self._on_failure.setdefault(key, callback)

    async def failed(self) -> None:
        """The transaction ended without a commit (or its outcome is unknown): run the
        callbacks, each once."""
        callbacks, self._on_failure = list(self._on_failure.values()), {}
        for callback in callbacks:
            try:
                await callback()
            except (ClientError, ServerError, ConnectionError) as e:
                log.warning("transaction %s: asking for redelivery failed: %s", self._name(), e)

    def committed(self) -> None:
        """The transaction committed: nobody needs telling."""
        self._on_failure.clear()
