"""A v4 transaction's registrations with its coordinator: ADD_PARTITION_TO_TXN and
ADD_SUBSCRIPTION_TO_TXN, each made once per topic (and subscription).

Only the v4 path has them: a v4 coordinator must know every participant to send its
END_TXN markers to, while v5 participants record their own part (op records), so a v5
transaction skips the call (:meth:`segtxn.client.transaction.Transaction.add_partition`).
The first send or acknowledgment to need a registration makes the call; concurrent ones
wait for that same call, each within its own limit.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from segtxn.client.coordinators import Coordinators
from segtxn.client.errors import Timeout
from segtxn.client.timeouts import Deadline
from segtxn.protocol.errors import ErrorCategory
from segtxn.protocol.txn import TxnId

__all__ = ["Registrations"]


class Registrations:
    """ADD_PARTITION / ADD_SUBSCRIPTION calls made (or in flight), so each happens once."""

    def __init__(self, coordinators: Coordinators) -> None:
        self._coordinators = coordinators
        self._made: dict[str, asyncio.Future[None]] = {}

    def _done(self, what: str, future: asyncio.Future[None]) -> None:
        """A failed registration is forgotten (the next operation asks again), its error
        taken in: every caller may have given up on it first, and an error nobody retrieves
        is logged with a traceback."""
        if (future.cancelled() or future.exception() is not None) and self._made.get(
            what
        ) is future:
            del self._made[what]

    async def register(
        self,
        txn: TxnId,
        command: str,
        topic: str,
        subscription: str | None,
        deadline: Deadline,
    ) -> None:
        """Register ``topic`` (with ``subscription``: that subscription of it) in ``txn``,
        by ``deadline``; cheap once registered.

        Raises ServerError (refused: the next call asks again), or Timeout (RETRIABLE:
        the operation was not done; the registration may still complete for the next one)."""
        what = (
            f"partition {topic}" if subscription is None else f"subscription {topic} {subscription}"
        )
        future = self._made.get(what)
        if future is None:  # the first caller registers; concurrent ones wait for it
            body: dict[str, Any] = {"topics": [topic]}
            if subscription is not None:
                body["subscription"] = subscription
            future = asyncio.ensure_future(
                self._coordinators.call("POST", f"/txn/v2/{txn}/{command}", json=body)
            )
            future.add_done_callback(functools.partial(self._done, what))
            self._made[what] = future
        try:
            async with deadline.timeout():
                await asyncio.shield(future)  # shared: this caller's limit does not end it
        except Timeout:  # the registration itself gave up (forgotten by _done)
            raise
        except TimeoutError as e:
            raise Timeout(
                f"transaction {txn}: {what} not registered within {deadline}",
                category=ErrorCategory.RETRIABLE,
            ) from e
