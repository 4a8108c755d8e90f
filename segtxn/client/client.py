"""The segtxn client: ``async with Client(url) as client: ...``.

Every call ends within its time limit (docs/protocol.md, "Client time limits"): the
client's ``operation_timeout_s`` unless the call takes its own (``send_timeout_s``,
``receive(timeout_s)``, ...). Creating producers, consumers and readers retries while a
broker or the metadata store restarts, on the next service URL when several are given.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from segtxn.client.admin import Admin
from segtxn.client.checkpoint import CheckpointConsumer
from segtxn.client.closables import OpenSet
from segtxn.client.connection import Connector, service_urls
from segtxn.client.consumer import Consumer
from segtxn.client.coordinators import Coordinators
from segtxn.client.credentials import Token, client_token
from segtxn.client.errors import ClientClosed
from segtxn.client.layout import TopicLayout
from segtxn.client.producer import Producer
from segtxn.client.producer_options import ProducerOptions
from segtxn.client.reader import Reader
from segtxn.client.scalable import ScalableProducer
from segtxn.client.timeouts import Deadline, Timeouts, checked_limit
from segtxn.client.transaction import Transaction, TransactionState
from segtxn.protocol import errors, names
from segtxn.protocol.auth import bearer_middleware, client_ssl_context
from segtxn.protocol.names import Domain, TopicName

__all__ = ["Client"]


def _topic(name: str) -> TopicName:
    try:
        return TopicName.parse(name)
    except names.InvalidTopicName as e:
        raise errors.InvalidTopicName(str(e)) from e


def _lifetime(timeout_s: object) -> float:
    """A transaction's ``timeout_s``: a finite number of seconds > 0 (unlike a call's limit,
    never None: a lifetime has no "no limit").

    Raises:
        TypeError: not a number (None and bool included).
        ValueError: nan, infinite, 0 or negative.
    """
    what = "timeout_s (the transaction's lifetime)"
    if timeout_s is None:
        raise TypeError(f"{what} is a number of seconds > 0, not None")
    try:
        lifetime = checked_limit(timeout_s)
    except TypeError:
        raise TypeError(
            f"{what} is a number of seconds > 0, not {type(timeout_s).__name__}"
        ) from None
    except ValueError:
        lifetime = None
    if not lifetime:
        raise ValueError(f"{what} must be a finite number of seconds > 0; got {timeout_s!r}")
    return lifetime


class Client:
    """A connection to a segtxn cluster through any of its brokers.

    Args:
        service_url: a broker's HTTP URL (``http://host:port``), several separated by
            commas, or a list: calls go to one that answers (Pulsar's multi-host service
            URL); lookups find each topic's own broker.
        operation_timeout_s: the default limit of every call that has no limit of its own:
            creating producers, consumers and readers (retries included), acknowledgments,
            negative acks, transactions' start/commit/abort, admin calls, closing.
        request_timeout_s: one attempt of a retried call (a lookup, a WebSocket handshake,
            a coordinator call) before it is tried again, on the next URL if there is one.
        prestart_transactions: open transactions ahead in the background, in batches
            that grow with use, so a loop of transactions spends no round trip on NEW_TXN
            and a fraction of one store write each (segtxn/client/prestart.py; those left
            unused are aborted at close).
        one_step_commit: commit a v5 transaction whose sends and acks all went to one
            broker at that broker, in the store step that writes its last operations,
            instead of END_TXN at a coordinator after them (segtxn/client/onestep.py;
            the outcome and errors are the same). False: always END_TXN.
        token: for a cluster with security on, a signed token (JWT) sent as
            ``Authorization: Bearer`` on every request and WebSocket upgrade
            (docs/security.md), or where to get one: a :class:`~pathlib.Path` to a file
            holding it (re-read when it changes), or a callable, plain or async, returning
            one (called again when the last one expires within 30 s), or a
            :class:`~segtxn.protocol.tokens.TokenSource`. A WebSocket the broker closes
            when its token expires reconnects with a fresh one, as after any drop.
            Default: the ``SEGTXN_TOKEN`` environment variable, else the file
            ``SEGTXN_TOKEN_FILE`` names, if set.
        tls_ca: for ``https://`` brokers: the CA file their certificates are checked
            against (default: the system's CAs). Servers are always verified.
        tls_cert: a certificate (PEM) to present to servers that ask for one, with its key
            in ``tls_key`` (default: the same file).

    Raises:
        ValueError: no service URL, a limit that is not a positive finite number, a token
            that is not one line of printable characters, or a TLS file that cannot be
            loaded.
        TypeError: a limit that is not a number.

    Every ``timeout_s`` the client's calls take is None (the call's default) or a finite
    number of seconds >= 0; anything else (nan, inf, a negative number, a string) raises
    ValueError or TypeError naming it, before the call does anything.
    """

    def __init__(
        self,
        service_url: str | Sequence[str],
        *,
        operation_timeout_s: float = 30.0,
        request_timeout_s: float = 10.0,
        prestart_transactions: bool = False,
        one_step_commit: bool = True,
        token: Token | None = None,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
    ) -> None:
        self.service_urls = service_urls(service_url)
        source = client_token(token)
        self._auth = () if source is None else (bearer_middleware(source),)
        self._ssl = (
            client_ssl_context(*(Path(f) if f else None for f in (tls_ca, tls_cert, tls_key)))
            if tls_ca or tls_cert
            else True  # aiohttp's default: the system's CAs, host names checked
        )
        self.service_url = ",".join(self.service_urls)
        self.timeouts = Timeouts(operation_timeout_s, request_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._connector: Connector | None = None
        self._closables: OpenSet[Producer | ScalableProducer | Consumer | Reader] = OpenSet()
        self._coordinators: Coordinators | None = None
        self._prestart = prestart_transactions
        self._one_step = one_step_commit
        self._transactions: weakref.WeakSet[Transaction] = weakref.WeakSet()

    async def __aenter__(self) -> Client:
        # every producer and consumer stream holds a connection: no pool limit (aiohttp's
        # default of 100 would make the 101st wait forever)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ssl=self._ssl),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeouts.request_timeout_s),
            middlewares=self._auth,
        )
        self._connector = Connector(self.service_urls, self._session, timeouts=self.timeouts)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the client; a block left because it was cancelled (Ctrl-C, a task's
        cancel) does not wait to flush its producers: what is in flight fails at once with
        ClientClosed (it may have been stored) instead of holding the exit for up to the
        operation timeout."""
        cancelled = isinstance(exc, asyncio.CancelledError | KeyboardInterrupt)
        await self.close(timeout_s=0 if cancelled else None)

    @property
    def connector(self) -> Connector:
        if self._connector is None:
            raise ClientClosed(
                "the client is closed, or was never opened: use it as "
                "`async with Client(url) as client`"
            )
        return self._connector

    @property
    def admin(self) -> Admin:
        """Topic administration (create, delete, stats, subscriptions, properties); each
        call is one request, within the operation timeout."""
        return Admin(self.connector)

    def _deadline(self, timeout_s: float | None) -> Deadline:
        return Deadline(self.timeouts.limit(timeout_s))

    async def create_producer(
        self, topic: str, *, name: str | None = None, timeout_s: float | None = None, **options: Any
    ) -> Producer | ScalableProducer:
        """A producer for ``topic`` (``persistent://`` or ``topic://``).

        Args:
            name: producer name; reuse it after a restart to keep de-duplication.
            timeout_s: limit of this call (default: the operation timeout); a broker that
                is down or restarting meanwhile is tried again.
            options: fields of :class:`ProducerOptions` (send_timeout_s, batching, ...).

        Raises:
            ServerError: TopicNotFound, ProducerBusy, InvalidTopicName, ...
            Timeout: not connected in time (RETRIABLE; it names the last failure).
        """
        deadline = self._deadline(timeout_s)
        parsed = _topic(topic)
        opts = ProducerOptions(**options)
        producer: Producer | ScalableProducer
        if parsed.domain is Domain.TOPIC:
            producer = ScalableProducer(self.connector, parsed, name, opts)
        else:
            producer = Producer(self.connector, parsed, name, opts)
        await producer.start(deadline)
        self._closables.add(producer)
        return producer

    async def subscribe(
        self,
        topic: str,
        subscription: str,
        *,
        subscription_type: str = "Exclusive",
        initial_position: str = "latest",
        name: str | None = None,
        receiver_queue_size: int = 1000,
        timeout_s: float | None = None,
    ) -> Consumer:
        """A consumer on ``subscription`` of ``topic`` (every segment, for ``topic://``).

        Args:
            subscription_type: Exclusive, Failover or Shared.
            initial_position: where a new subscription starts: earliest or latest.
            timeout_s: limit of this call (default: the operation timeout); a broker that
                is down or restarting meanwhile is tried again.

        Raises:
            ServerError: TopicNotFound, ConsumerBusy, InvalidTopicName, InvalidArgument (a
                subscription name no subscription can have: checked before connecting), ...
            Timeout: not attached in time (RETRIABLE; it names the last failure).
            TypeError: ``subscription`` is not a str.
        """
        deadline = self._deadline(timeout_s)
        parsed = _topic(topic)
        # checked here as the broker does: an empty name never reached its check (the URL
        # it makes is another endpoint's, and the answer was "no such endpoint")
        if not isinstance(subscription, str):
            raise TypeError(f"a subscription is named by a str, not {type(subscription).__name__}")
        if (problem := names.client_name_problem("subscription", subscription)) is not None:
            raise errors.InvalidArgument(problem)
        layout = None
        if parsed.domain is Domain.TOPIC:
            layout = TopicLayout(self.connector, parsed)
            await layout.start(deadline)
        consumer = Consumer(
            self.connector,
            parsed,
            subscription,
            layout=layout,
            sub_type=subscription_type,
            initial=initial_position,
            name=name,
            receiver_queue_size=receiver_queue_size,
        )
        await consumer.start(deadline)
        self._closables.add(consumer)
        return consumer

    async def checkpoint_consumer(
        self,
        topic: str,
        checkpoint: dict[str, Any] | None = None,
        *,
        receiver_queue_size: int = 1000,
        timeout_s: float | None = None,
    ) -> CheckpointConsumer:
        """Read a scalable topic with positions you keep (``consumer.checkpoint()``); pass a
        saved checkpoint to resume there, across splits and merges. ``timeout_s`` and the
        errors: as :meth:`subscribe`; ValueError for a ``checkpoint`` that is not one."""
        deadline = self._deadline(timeout_s)
        parsed = _topic(topic)
        if parsed.domain is not Domain.TOPIC:
            raise errors.NotAllowed("checkpoint consumers read topic:// topics")
        layout = TopicLayout(self.connector, parsed)
        consumer = CheckpointConsumer(  # a bad checkpoint: ValueError, before connecting
            self.connector, parsed, layout, checkpoint, receiver_queue_size=receiver_queue_size
        )
        await layout.start(deadline)
        await consumer.start(deadline)
        self._closables.add(consumer)
        return consumer

    def transaction(
        self, *, timeout_s: float = 60.0, after: Transaction | None = None
    ) -> Transaction:
        """A new transaction: ``async with client.transaction() as txn: ...`` commits on
        exit and aborts on an exception. The coordinator aborts it after ``timeout_s`` (its
        lifetime); each of its calls has the client's operation timeout.

        ``after``: a transaction whose commit may still be under way (pipelining a
        consume-transform-produce loop: the next batch is worked on while the last one
        commits). This one starts once that one's sends and acks are done, and commits
        only once that one has committed; if that one is aborted (or its outcome is not
        known within this one's commit limit), this one is aborted too and its commit
        raises TransactionFailed from PrecedingNotCommitted. So what the two wrote counts
        in their order, or not at all (docs/transactions.md, "Pipelined transactions").

        Raises:
            TypeError / ValueError: ``timeout_s`` is not a finite number of seconds > 0
                (the coordinator's upper bound, 3600 s unless configured, is its to check:
                InvalidArgument at the transaction's start), or ``after`` is not a
                Transaction.
        """
        lifetime = _lifetime(timeout_s)
        if after is not None and not isinstance(after, Transaction):
            raise TypeError(f"after must be a Transaction or None, not {type(after).__name__}")
        if self._coordinators is None:
            self._coordinators = Coordinators(self.connector, prestart=self._prestart)
        txn = Transaction(self._coordinators, lifetime, one_step=self._one_step, after=after)
        self._transactions.add(txn)  # to abort at close() if left open
        return txn

    async def create_reader(
        self,
        topic: str,
        *,
        start: str = "earliest",
        end: str | None = None,
        receiver_queue_size: int = 1000,
        timeout_s: float | None = None,
    ) -> Reader:
        """A reader of one ``persistent://`` topic or one ``segment://`` of a scalable topic
        from ``start`` (earliest, latest, or ``LEDGER:ENTRY``). With ``end`` (``latest``: the
        last entry stored now, or ``LEDGER:ENTRY``, inclusive) it ends once past it:
        ``reader.ended()``, and ``receive`` raises :class:`TopicEnded` when nothing is left.
        ``timeout_s`` and the errors: as :meth:`subscribe`; a ``topic://`` (a scalable
        topic: many segments) is NotAllowed: read a segment, or the whole topic with
        :meth:`checkpoint_consumer`."""
        deadline = self._deadline(timeout_s)
        parsed = _topic(topic)
        if parsed.domain is Domain.TOPIC:
            raise errors.NotAllowed(
                f"{parsed} is a scalable topic and a reader reads one topic or segment: read "
                f"a segment of it (segment://{parsed.tenant}/{parsed.namespace}/"
                f"{parsed.local}/N), or the whole topic with checkpoint_consumer()"
            )
        reader = Reader(
            self.connector,
            parsed,
            start=start,
            end=end,
            receiver_queue_size=receiver_queue_size,
        )
        await reader.start(deadline)
        self._closables.add(reader)
        return reader

    async def close(self, *, timeout_s: float | None = None) -> None:
        """Abort the transactions this client opened and left open (or is opening: a
        send's NEW_TXN on its way), then close every producer (flushing), consumer and
        reader still open, at once, then the connections; all within ``timeout_s`` (default:
        the operation timeout). With ``timeout_s=0`` (what leaving
        ``async with`` by a cancel does) nothing waits: open transactions are left to
        their coordinators, which abort them at their timeouts.

        An open transaction holds what it acknowledged, and every reader of a segment it
        wrote to waits behind it until it ends: left to its timeout, that is up to its
        lifetime (60 s by default; Kafka's producer aborts its open transaction at close
        too). What the application does with such a transaction next (``commit()``, a
        send, leaving its ``async with`` block) raises ClientClosed. An abort that fails
        is logged at WARNING, not raised. A transaction whose END_TXN(COMMIT) is on its
        way is not touched."""
        deadline = Deadline(self.timeouts.limit(timeout_s))
        if deadline.timeout_s:
            left_open = [
                t for t in self._transactions if t.state is TransactionState.OPEN or t.opening
            ]
            remaining = deadline.remaining() or 0.0
            await asyncio.gather(*(t.abort_at_close(remaining) for t in left_open))
        closing = [
            c.close(deadline.remaining())
            if isinstance(c, Producer | ScalableProducer)
            else c.close()
            for c in self._closables.newest_first()
        ]
        await asyncio.gather(*closing)
        self._closables.clear()
        self._transactions.clear()  # a second close() leaves them as the first did
        if self._coordinators is not None:
            await self._coordinators.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
            self._connector = None
