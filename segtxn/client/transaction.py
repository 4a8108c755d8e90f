"""Transactions, the Pythonic way.

```python
async with client.transaction(timeout_s=30) as txn:
    await producer.send(b"derived", key="k", txn=txn)
    await consumer.acknowledge(message, txn=txn)
# committed here; an exception inside the block aborts instead
```

Sends and acks in a transaction are tracked: ``commit`` first waits for every one of them.
If any failed, the transaction is *poisoned*: ``commit`` aborts it and raises
:class:`TransactionFailed` (a transaction is all or nothing, so one lost message means none
may count). A transaction whose timeout passes is aborted by its coordinator; committing it
then fails with ``InvalidTxnStatus``.

When a transaction does not commit (it is aborted, its commit is refused, or ending it fails
with an unknown outcome), every consumer that acknowledged messages in it asks the broker to
deliver its unacknowledged messages again, from the earliest, once the transaction has let
go of them; until then it hands the application nothing newer from those topics. So after
``abort()`` returns, the next messages an ordered consumer receives start with the ones
the transaction had acknowledged, as if the consumer had sought back (Kafka's consumer does
this by hand after an abort).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from segtxn.client.connection import Connector
from segtxn.client.errors import ClientError
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnAction, TxnId

log = logging.getLogger(__name__)


class TransactionFailed(ClientError):
    """The transaction was aborted because one of its operations failed (see __cause__)."""


class Coordinators:
    """Finds the v5 coordinators through any broker, and fails over between them."""

    def __init__(self, connector: Connector, retry_for_s: float = 30.0) -> None:
        self._connector = connector
        self._urls: list[str] = []
        self._next = itertools.count()
        self._retry_for_s = retry_for_s

    async def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call a coordinator. While none answers (one died, a standby is taking over),
        try the others and look them up again, backing off, for ``retry_for_s``: every
        coordinator call is safe to repeat.

        Raises:
            ServerError: the coordinator's answer, or ServiceNotReady after the retries.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._retry_for_s
        delay = 0.05
        while True:
            try:
                if not self._urls:
                    found = await self._connector.request("GET", "/lookup/v2/coordinators")
                    self._urls = list(found["coordinators"])
                    if not self._urls:
                        raise ServerError(
                            ErrorName.SERVICE_NOT_READY, "no transaction coordinator is up"
                        )
                url = self._urls[next(self._next) % len(self._urls)]
                return await self._connector.request(method, url + path, **kwargs)
            except ServerError as e:
                if e.name is not ErrorName.SERVICE_NOT_READY or loop.time() > deadline:
                    raise
                self._urls = []  # look them up again
                await asyncio.sleep(delay)  # back off while a standby takes over
                delay = min(delay * 2, 1.0)


class Transaction:
    """One transaction. Get it from ``client.transaction()``; use it as an async context
    manager, or call ``commit()`` / ``abort()`` yourself."""

    def __init__(self, coordinators: Coordinators, timeout_s: float) -> None:
        self._coordinators = coordinators
        self._timeout_s = timeout_s
        self._id: TxnId | None = None
        self.state = "NEW"
        self._in_flight: set[asyncio.Future[Any]] = set()
        self._failure: BaseException | None = None
        self._registered: dict[str, asyncio.Future[None]] = {}
        self._starting = asyncio.Lock()
        """ADD_PARTITION / ADD_SUBSCRIPTION calls made (or in flight), so each happens once."""
        self._on_failure: dict[object, Callable[[], Awaitable[None]]] = {}

    @property
    def id(self) -> TxnId:
        if self._id is None:
            raise ClientError(
                "the transaction has not started: it starts with its first send or "
                "acknowledgment (or call start())"
            )
        return self._id

    @property
    def wire_id(self) -> tuple[int, int]:
        return (self.id.most, self.id.least)

    async def start(self, protocol: str = "v5") -> Transaction:
        """NEW_TXN now, for a v5 transaction (scalable topics) or a v4 one (``persistent://``
        topics). Without it, the first send or acknowledgment starts the transaction with
        the protocol its topic's domain calls for.

        Raises ServerError (ServiceNotReady: no coordinator; NotAllowed: no v4 here)."""
        if self._id is None:
            async with self._starting:
                if self._id is None:
                    reply = await self._coordinators.call(
                        "POST",
                        "/txn/v2/new",
                        params={"timeout_s": str(self._timeout_s), "protocol": protocol},
                    )
                    self._id = TxnId.parse(reply["txnId"])
                    self.state = "OPEN"
        return self

    def _check_open(self, *also: str) -> None:
        if self.state != "OPEN" and self.state not in also:
            raise ClientError(f"transaction {self._id} is {self.state}")

    async def add_partition(self, topic: str) -> None:
        """ADD_PARTITION_TO_TXN (once per topic): the coordinator checks the domain."""
        await self._register(f"partition {topic}", "partitions", topic)

    async def add_subscription(self, topic: str, subscription: str) -> None:
        """ADD_SUBSCRIPTION_TO_TXN (once per topic and subscription)."""
        await self._register(
            f"subscription {topic} {subscription}", "subscriptions", topic, subscription
        )

    async def _register(
        self, what: str, command: str, topic: str, subscription: str | None = None
    ) -> None:
        v4 = topic.startswith("persistent://")
        if self.state == "NEW":
            await self.start("v4" if v4 else "v5")
        self._check_open()
        if v4 == self.id.is_v5:
            raise ServerError(
                ErrorName.NOT_ALLOWED,
                f"{topic} cannot join {self.id}: a v{5 if self.id.is_v5 else 4} transaction "
                "spans only "
                + ("scalable (topic://) topics" if self.id.is_v5 else "persistent:// topics")
                + "; v4 and v5 never mix in one transaction",
            )
        future = self._registered.get(what)
        if future is None:  # the first caller registers; concurrent ones wait for it
            body: dict[str, Any] = {"topics": [topic]}
            if subscription is not None:
                body["subscription"] = subscription
            future = asyncio.ensure_future(
                self._coordinators.call("POST", f"/txn/v2/{self.id}/{command}", json=body)
            )
            self._registered[what] = future
        try:
            await asyncio.shield(future)
        except ServerError:
            self._registered.pop(what, None)  # a refused registration may be asked again
            raise

    def track(self, future: asyncio.Future[Any]) -> None:
        """Count an operation in the transaction: if it fails, the transaction fails."""
        self._in_flight.add(future)
        future.add_done_callback(self._settled)

    def _settled(self, future: asyncio.Future[Any]) -> None:
        self._in_flight.discard(future)
        if not future.cancelled() and future.exception() is not None and self._failure is None:
            self._failure = future.exception()

    def on_failure(self, key: object, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` (once per ``key``) if this transaction ends without a commit:
        aborted, refused, or with an outcome unknown. Consumers use it to have what they
        acknowledged in it delivered again, in order."""
        self._on_failure.setdefault(key, callback)

    async def _failed(self) -> None:
        callbacks, self._on_failure = list(self._on_failure.values()), {}
        for callback in callbacks:
            try:
                await callback()
            except (ClientError, ServerError, ConnectionError) as e:
                log.warning("transaction %s: asking for redelivery failed: %s", self._id, e)

    def poison(self, error: BaseException) -> None:
        """Mark the transaction failed (its commit will abort)."""
        if self._failure is None:
            self._failure = error

    async def commit(self) -> None:
        """Wait for the transaction's operations, then END_TXN(COMMIT).

        Raises:
            TransactionFailed: an operation failed; the transaction was aborted.
            ServerError(InvalidTxnStatus): it timed out (or was aborted) first.
        """
        if self.state == "NEW":  # nothing was done in it
            self.state = "COMMITTED"
            return
        self._check_open("COMMITTING")  # a commit whose outcome is unknown may be retried
        await asyncio.gather(*self._in_flight, return_exceptions=True)
        if self._failure is not None:
            try:
                await self._end(TxnAction.ABORT)
            finally:
                await self._failed()
            raise TransactionFailed(
                f"transaction {self._id} aborted: an operation in it failed"
            ) from self._failure
        self.state = "COMMITTING"
        try:
            await self._end(TxnAction.COMMIT)
        except BaseException as e:
            if isinstance(e, ServerError) and e.name in (
                ErrorName.INVALID_TXN_STATUS,
                ErrorName.TRANSACTION_NOT_FOUND,
            ):
                self.state = "ABORTED"
            await self._failed()  # aborted, or unknown: commit() may be called again
            raise
        self._on_failure.clear()

    async def abort(self) -> None:
        """END_TXN(ABORT); nothing the transaction wrote or acknowledged will count."""
        if self.state in ("ABORTED", "COMMITTED"):
            return
        if self.state == "NEW":
            self.state = "ABORTED"
            return
        await asyncio.gather(*self._in_flight, return_exceptions=True)
        try:
            await self._end(TxnAction.ABORT)
        finally:
            await self._failed()

    async def _end(self, action: TxnAction) -> None:
        await self._coordinators.call(
            "POST", f"/txn/v2/{self.id}/end", params={"action": action.value}
        )
        self.state = "COMMITTED" if action is TxnAction.COMMIT else "ABORTED"

    async def status(self) -> str:
        reply = await self._coordinators.call("GET", f"/txn/v2/{self.id}")
        return str(reply["state"])

    async def __aenter__(self) -> Transaction:
        return self  # started by its first send or acknowledgment (v4 or v5 by topic)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.state != "OPEN":
            return  # ended explicitly inside the block
        if exc is None:
            await self.commit()
        else:
            with contextlib.suppress(ServerError):
                await self.abort()
