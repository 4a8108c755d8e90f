"""Reaching the transaction coordinators: finding them through any broker, failing over
between them within a call's limit, and pre-starting transactions when asked to
(:mod:`segtxn.client.prestart`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from typing import Any

from segtxn.client.connection import Connector
from segtxn.client.errors import ClientError
from segtxn.client.prestart import MAX_BATCH, Opened, Spares
from segtxn.client.timeouts import Deadline, retrying
from segtxn.protocol.errors import ErrorCategory, ServerError, ServiceNotReady
from segtxn.protocol.txn import TxnAction, TxnId

MAX_SPARE_KINDS = 4
"""Kinds of transaction (protocol and ``timeout_s``) kept pre-started, the most recently
used: an application whose ``timeout_s`` varies (a remaining budget) kept spares, and open
transactions at the coordinator, for every value it ever used."""

__all__ = ["Coordinators"]

log = logging.getLogger(__name__)


class Coordinators:
    """Finds the transaction coordinators through any broker, fails over between them, and
    keeps a pre-started transaction when asked to."""

    def __init__(self, connector: Connector, *, prestart: bool = False) -> None:
        self._connector = connector
        self._urls: list[str] = []
        self._next = itertools.count()
        self._prestart = prestart
        self._spares: dict[tuple[str, float], Spares] = {}
        self._aborting: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def connector(self) -> Connector:
        """How the client reaches its brokers (a transaction's one-step commit asks one)."""
        return self._connector

    @property
    def operation_timeout_s(self) -> float:
        return self._connector.timeouts.operation_timeout_s

    async def call(
        self,
        method: str,
        path: str,
        *,
        deadline: Deadline | None = None,
        category: ErrorCategory = ErrorCategory.RETRIABLE,
        **kwargs: Any,
    ) -> Any:
        """Call a coordinator. While none answers (one died or is paused, a standby is
        taking over), try the others and look them up again, backing off, until
        ``deadline``: every coordinator call is safe to repeat.

        Args:
            deadline: when to give up (default: the client's operation timeout from now).
            category: what a Timeout means for this call (OUTCOME_UNKNOWN for a commit).

        Raises:
            ServerError: the coordinator's answer.
            Timeout: no coordinator answered by ``deadline`` (it names the last failure).
        """
        reply, _ = await self._call(method, path, deadline=deadline, category=category, **kwargs)
        return reply

    async def _call(
        self,
        method: str,
        path: str,
        *,
        deadline: Deadline | None = None,
        category: ErrorCategory = ErrorCategory.RETRIABLE,
        prefer: str | None = None,
        **kwargs: Any,
    ) -> tuple[Any, str]:
        """:meth:`call`, trying ``prefer`` first when it is among the coordinators; also
        returns the URL that answered."""
        first = [prefer]

        async def attempt() -> tuple[Any, str]:
            try:
                if not self._urls:
                    found = await self._connector.request("GET", "/lookup/v2/coordinators")
                    self._urls = list(found["coordinators"])
                    if not self._urls:
                        raise ServiceNotReady("no transaction coordinator is up")
                wanted = first.pop() if first else None
                url = (
                    wanted
                    if wanted in self._urls
                    else self._urls[next(self._next) % len(self._urls)]
                )
                return await self._connector.request(method, url + path, **kwargs), url
            except BaseException as e:
                if not isinstance(e, ServerError) or e.retriable:
                    self._urls = []  # look them up again: the next attempt goes elsewhere
                raise

        return await retrying(
            f"{method} {path}",
            attempt,
            deadline or Deadline(self.operation_timeout_s),
            request_timeout_s=self._connector.timeouts.request_timeout_s,
            category=category,
        )

    async def open(self, protocol: str, timeout_s: float, deadline: Deadline) -> Opened:
        """NEW_TXN, or a pre-started transaction when there is a fresh one.

        Raises ServerError / Timeout (see :meth:`call`).
        """
        if self._prestart and not self._closed:
            key = (protocol, timeout_s)
            spares = self._spares.pop(key, None)  # put back last: the most recently used
            if spares is None:
                spares = Spares(
                    functools.partial(self._open_batch, protocol, timeout_s),
                    self.abort_soon,
                    max_batch=MAX_BATCH if protocol == "v5" else 1,
                )
                while len(self._spares) >= MAX_SPARE_KINDS:
                    self._retire(self._spares.pop(next(iter(self._spares))))
            self._spares[key] = spares
            spare = await spares.take(deadline)
            if spare is not None:
                return spare
        return await self._open(protocol, timeout_s, deadline)

    async def _open_batch(self, protocol: str, timeout_s: float, count: int) -> list[Opened]:
        """``count`` transactions opened ahead, in one NEW_TXN call."""
        deadline = Deadline(self.operation_timeout_s)
        if count == 1:
            return [await self._open(protocol, timeout_s, deadline)]
        reply, url = await self._call(
            "POST",
            "/txn/v2/new",
            deadline=deadline,
            params={"timeout_s": str(timeout_s), "protocol": protocol, "count": str(count)},
        )
        at = asyncio.get_running_loop().time()
        # (a coordinator that predates count answers with one transaction)
        opened = reply.get("transactions", [reply])
        return [Opened(TxnId.parse(item["txnId"]), url, at) for item in opened]

    async def _open(self, protocol: str, timeout_s: float, deadline: Deadline) -> Opened:
        reply, url = await self._call(
            "POST",
            "/txn/v2/new",
            deadline=deadline,
            params={"timeout_s": str(timeout_s), "protocol": protocol},
        )
        return Opened(TxnId.parse(reply["txnId"]), url, asyncio.get_running_loop().time())

    async def end(self, txn: TxnId, action: TxnAction, deadline: Deadline, url: str | None) -> None:
        """END_TXN, at ``url`` first (where it was opened) when given."""
        await self._call(
            "POST",
            f"/txn/v2/{txn}/end",
            deadline=deadline,
            category=(
                ErrorCategory.OUTCOME_UNKNOWN
                if action is TxnAction.COMMIT
                else ErrorCategory.RETRIABLE
            ),
            prefer=url,
            params={"action": action.value},
        )

    def _retire(self, spares: Spares) -> None:
        """Stop opening ``spares`` ahead and abort those it holds (in the background)."""

        async def retire() -> None:
            for opened in await spares.close():
                self.abort_soon(opened)

        task = asyncio.create_task(retire(), name="txn-prestart-retire")
        self._aborting.add(task)
        task.add_done_callback(self._aborting.discard)

    def abort_soon(self, opened: Opened) -> None:
        """Abort ``opened`` in the background (best effort: its coordinator times it out
        anyway); ``close`` waits for it. For a transaction opened that nothing will use."""
        task = asyncio.create_task(self._abort_spare(opened), name="txn-prestart-abort")
        self._aborting.add(task)
        task.add_done_callback(self._aborting.discard)

    async def _abort_spare(self, opened: Opened) -> None:
        try:
            deadline = Deadline(self.operation_timeout_s)
            await self.end(opened.txn, TxnAction.ABORT, deadline, opened.url)
        except (ServerError, ClientError) as e:  # its coordinator times it out anyway
            log.debug("pre-started transaction %s not aborted (%s)", opened.txn, e)

    async def close(self) -> None:
        """Abort the pre-started transactions (best effort: unused, they time out anyway)."""
        self._closed = True
        spares, self._spares = list(self._spares.values()), {}
        for left in await asyncio.gather(*(s.close() for s in spares)):
            for opened in left:
                self.abort_soon(opened)
        while self._aborting:  # (a retiring kind's spares add their aborts meanwhile)
            await asyncio.gather(*self._aborting, return_exceptions=True)
