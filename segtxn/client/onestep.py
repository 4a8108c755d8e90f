"""The one-step commit, client side: where a transaction's operations went, and asking
their broker to commit (docs/transactions.md, "The one-step commit").

Why: a v5 commit costs two metadata-store steps, the brokers' op records of the
transaction's sends and acks, then END_TXN's compare-and-set on the transaction's header.
When every operation of a transaction went to one broker, that broker can fold the
compare-and-set into the step that writes the last of them: one step instead of two, and
no round trip to a coordinator.

The contract with the broker (a ``commit`` frame on a producer connection the client holds
to it, :mod:`segtxn.client.commitchannel`; else ``POST {broker}/txn/v2/{txn}/commit``, body
``{"ops": n, "digest": d}``; the same answers): ``n`` is the number of distinct operation
names this client *placed* on that broker in the transaction and ``d`` their
:func:`~segtxn.protocol.txnops.digest`. The broker commits only if the op records it queued
for the transaction are exactly those, so a COMMITTED answer means every operation was
durable in the same step, whatever their own answers say (a receipt lost on the way does
not undo it). Its answers:

- 200 ``{"state": "COMMITTED"}``: committed (:attr:`Answer.COMMITTED`);
- 200 ``{"state": "OPEN", ...}``: nothing decided there (:attr:`Answer.NOT_HERE`); so are
  InvalidArgument and InvalidMessage (an older broker without the route or the frame
  answers so), NotAllowed and the authentication errors: the coordinator's END_TXN would
  meet them if they mattered;
- ``InvalidTxnStatus`` / ``TransactionNotFound``: the transaction is over without a commit
  (raised, as END_TXN's are);
- anything else (ServiceNotReady, another error, no answer in time, a broken connection):
  :attr:`Answer.UNKNOWN`; the commit may have landed.

An operation is *placed* on a broker when its frame is written to a WebSocket connected to
it (:meth:`Placements.placed`, called by producers and consumer streams through
``Transaction.placed``). A resend after a reconnect places it again, possibly elsewhere:
a transaction is eligible only while every placement of every operation went to one
broker. Names placed that the broker never recorded (a send refused by a sealed segment, a
frame lost with its connection) make the digests differ: that costs the fast path, never
correctness.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Collection
from typing import Any

import aiohttp

from segtxn.client.commitchannel import CommitChannel
from segtxn.client.connection import Connector
from segtxn.client.errors import ClientClosed, ClientError
from segtxn.client.timeouts import Deadline
from segtxn.protocol.errors import (
    InvalidArgument,
    InvalidMessage,
    InvalidTxnStatus,
    NotAllowed,
    NotAuthorized,
    ServerError,
    TransactionNotFound,
    Unauthenticated,
)
from segtxn.protocol.txn import TxnId
from segtxn.protocol.txnops import digest

__all__ = ["Answer", "Placements", "commit_at"]

log = logging.getLogger(__name__)

NOT_HERE = (InvalidArgument, InvalidMessage, NotAllowed, Unauthenticated, NotAuthorized)
"""Refusals of the one-step commit that decide nothing: the client ends the transaction at
its coordinator instead, which answers for itself."""


class Answer(enum.Enum):
    """What the broker's answer to a one-step commit says about the transaction."""

    COMMITTED = "COMMITTED"
    """Committed, its operations durable in the same step."""
    NOT_HERE = "NOT_HERE"
    """Nothing decided: end it at the coordinator as if the broker had not been asked."""
    UNKNOWN = "UNKNOWN"
    """No usable answer: the commit may have landed."""


class Placements:
    """Where a transaction's operations were placed, by the future the transaction tracks
    for each: the brokers, the names placed on each, and which are not placed yet."""

    def __init__(self) -> None:
        self._placed: set[asyncio.Future[Any]] = set()
        """Operations placed and not yet settled (settled ones are forgotten)."""
        self._unplaced: set[asyncio.Future[Any]] = set()
        """Operations tracked and neither placed nor settled yet (:meth:`wait`)."""
        self._names: dict[str, set[str]] = {}
        """Broker URL -> the names of the operations placed on it (ever)."""
        self._channels: dict[str, CommitChannel] = {}
        """Broker URL -> the producer connection that last placed a send on it."""
        self._emptied: asyncio.Future[None] | None = None
        """Resolved when ``_unplaced`` empties (what every :meth:`wait` of the moment
        waits on)."""

    def tracking(self, future: asyncio.Future[Any]) -> None:
        """The transaction counts the operation ``future`` stands for (placed or not)."""
        if not future.done() and future not in self._placed:
            self._unplaced.add(future)

    def placed(
        self,
        future: asyncio.Future[Any],
        broker_url: str,
        name: str,
        channel: CommitChannel | None = None,
    ) -> None:
        """The operation ``future`` stands for, named ``name``
        (:mod:`segtxn.protocol.txnops`), is being written to ``broker_url`` (by a producer
        whose connection is ``channel``)."""
        if not future.done():
            self._placed.add(future)
        self._names.setdefault(broker_url, set()).add(name)
        if channel is not None:
            self._channels[broker_url] = channel
        self._no_longer_unplaced(future)

    def settled(self, future: asyncio.Future[Any]) -> None:
        """``future`` is done: its placement need not be remembered."""
        self._placed.discard(future)
        self._no_longer_unplaced(future)

    def _no_longer_unplaced(self, future: asyncio.Future[Any]) -> None:
        if future in self._unplaced:
            self._unplaced.discard(future)
            if not self._unplaced and self._emptied is not None and not self._emptied.done():
                self._emptied.set_result(None)

    def broker(self) -> str | None:
        """The one broker every placement went to; None for none, or several."""
        return next(iter(self._names)) if len(self._names) == 1 else None

    def channel(self, broker_url: str) -> CommitChannel | None:
        """A producer connection to ``broker_url`` a send was placed on, if one is still
        connected there (the commit is asked on it), else None (it is asked over HTTP)."""
        channel = self._channels.get(broker_url)
        if channel is None or not channel.supported or channel.broker_url != broker_url:
            return None
        return channel

    def names(self, broker_url: str) -> Collection[str]:
        """The distinct operation names placed on ``broker_url``."""
        return self._names.get(broker_url, set())

    async def wait(self, deadline: Deadline) -> bool:
        """Wait, until ``deadline``, until every operation tracked is placed or settled
        (those tracked meanwhile count too). False if one is neither by then. Each costs
        O(1), when it is tracked and when it is placed or settled: a wait that looked at every
        operation in flight, at each placement, made a transaction of a thousand take 50 %
        longer than with END_TXN (bench/peer.py ``txn 1000``), and one that registered a
        callback on each cost 5 µs per message at a hundred per transaction (py-spy)."""
        while self._unplaced:
            if deadline.expired():
                return False
            if self._emptied is None or self._emptied.done():
                self._emptied = asyncio.get_running_loop().create_future()
            try:  # shared by the waits of the moment (two commit() calls): one's own would
                async with asyncio.timeout(deadline.remaining()):  # leave the other asleep
                    await asyncio.shield(self._emptied)  # until its deadline
            except TimeoutError:
                return False
        return True


async def commit_at(
    connector: Connector, placements: Placements, broker_url: str, txn: TxnId, deadline: Deadline
) -> Answer:
    """Ask ``broker_url`` to commit ``txn``, naming the operations ``placements`` placed
    there: one attempt, within ``deadline`` and the client's ``request_timeout_s``; as a
    ``commit`` frame on a producer connection to it that placed one, else over HTTP.

    Raises:
        InvalidTxnStatus / TransactionNotFound: the transaction is over without a commit.
        ClientClosed: the client was closed (nothing was sent).
    """
    names, channel = placements.names(broker_url), placements.channel(broker_url)
    ops, summed = len(names), digest(names)
    timeout_s = deadline.cap(connector.timeouts.request_timeout_s)
    state: object
    reason: object = None
    try:
        if channel is not None:
            answer = await channel.commit(txn, ops, summed, timeout_s)
            state, reason = answer.state, answer.reason
        else:
            reply = await connector.request(
                "POST",
                f"{broker_url}/txn/v2/{txn}/commit",
                json={"ops": ops, "digest": summed},
                timeout_s=timeout_s,
            )
            state = reply.get("state") if isinstance(reply, dict) else reply
            reason = reply.get("reason") if isinstance(reply, dict) else None
    except (InvalidTxnStatus, TransactionNotFound, ClientClosed):
        raise
    except NOT_HERE as e:
        log.debug("transaction %s: %s did not commit it (%s: %s)", txn, broker_url, e.name, e)
        return Answer.NOT_HERE
    except (
        ServerError,
        ClientError,
        aiohttp.ClientError,
        ConnectionError,
        TimeoutError,
        ValueError,
    ) as e:
        log.debug("transaction %s: no answer from %s to its commit: %r", txn, broker_url, e)
        return Answer.UNKNOWN
    if state == "COMMITTED":
        return Answer.COMMITTED
    if state == "OPEN":
        log.debug("transaction %s: not committed at %s (%s)", txn, broker_url, reason)
        return Answer.NOT_HERE
    log.debug("transaction %s: %s answered its commit with %r", txn, broker_url, state)
    return Answer.UNKNOWN
