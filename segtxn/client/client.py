"""The segtxn client: ``async with Client(url) as client: ...``."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import aiohttp

from segtxn.client.admin import Admin
from segtxn.client.connection import Connector
from segtxn.client.consumer import CheckpointConsumer, Consumer
from segtxn.client.errors import ClientClosed
from segtxn.client.layout import TopicLayout
from segtxn.client.producer import Producer, ProducerOptions, ScalableProducer
from segtxn.client.reader import Reader
from segtxn.client.transaction import Coordinators, Transaction
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import Domain, InvalidTopicName, TopicName


def _topic(name: str) -> TopicName:
    try:
        return TopicName.parse(name)
    except InvalidTopicName as e:
        raise ServerError(ErrorName.INVALID_TOPIC_NAME, str(e)) from e


class Client:
    """A connection to a segtxn cluster through any of its brokers.

    Args:
        service_url: any broker's HTTP URL (``http://host:port``); lookups find the rest.
        request_timeout_s: timeout of admin and lookup calls.
    """

    def __init__(self, service_url: str, *, request_timeout_s: float = 30.0) -> None:
        self.service_url = service_url
        self._timeout = request_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._connector: Connector | None = None
        self._closables: list[Producer | ScalableProducer | Consumer | Reader] = []
        self._coordinators: Coordinators | None = None

    async def __aenter__(self) -> Client:
        # every producer and consumer stream holds a connection: no pool limit (aiohttp's
        # default of 100 would make the 101st wait forever)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeout),
        )
        self._connector = Connector(self.service_url, self._session, self._timeout)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def connector(self) -> Connector:
        if self._connector is None:
            raise ClientClosed("use the client as `async with Client(url) as client`")
        return self._connector

    @property
    def admin(self) -> Admin:
        """Topic administration (create, delete, stats, subscriptions, properties)."""
        return Admin(self.connector)

    async def create_producer(
        self, topic: str, *, name: str | None = None, **options: Any
    ) -> Producer | ScalableProducer:
        """A producer for ``topic`` (``persistent://`` or ``topic://``).

        Args:
            name: producer name; reuse it after a restart to keep de-duplication.
            options: fields of :class:`ProducerOptions` (batching, max_pending, ...).

        Raises:
            ServerError: TopicNotFound, ProducerBusy, InvalidTopicName, ...
        """
        parsed = _topic(topic)
        opts = ProducerOptions(**options)
        producer: Producer | ScalableProducer
        if parsed.domain is Domain.TOPIC:
            producer = ScalableProducer(self.connector, parsed, name, opts)
        else:
            producer = Producer(self.connector, parsed, name, opts)
        await producer.start()
        self._closables.append(producer)
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
    ) -> Consumer:
        """A consumer on ``subscription`` of ``topic`` (every segment, for ``topic://``).

        Args:
            subscription_type: Exclusive, Failover or Shared.
            initial_position: where a new subscription starts: earliest or latest.
        """
        parsed = _topic(topic)
        layout = None
        if parsed.domain is Domain.TOPIC:
            layout = TopicLayout(self.connector, parsed)
            await layout.start()
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
        await consumer.start()
        self._closables.append(consumer)
        return consumer

    async def checkpoint_consumer(
        self,
        topic: str,
        checkpoint: dict[str, Any] | None = None,
        *,
        receiver_queue_size: int = 1000,
    ) -> CheckpointConsumer:
        """Read a scalable topic with positions you keep (``consumer.checkpoint()``); pass a
        saved checkpoint to resume there, across splits and merges."""
        parsed = _topic(topic)
        if parsed.domain is not Domain.TOPIC:
            raise ServerError(ErrorName.NOT_ALLOWED, "checkpoint consumers read topic:// topics")
        layout = TopicLayout(self.connector, parsed)
        await layout.start()
        consumer = CheckpointConsumer(
            self.connector, parsed, layout, checkpoint, receiver_queue_size=receiver_queue_size
        )
        await consumer.start()
        self._closables.append(consumer)
        return consumer

    def transaction(self, *, timeout_s: float = 60.0) -> Transaction:
        """A new transaction: ``async with client.transaction() as txn: ...`` commits on
        exit and aborts on an exception. The coordinator aborts it after ``timeout_s``."""
        if self._coordinators is None:
            self._coordinators = Coordinators(self.connector)
        return Transaction(self._coordinators, timeout_s)

    async def create_reader(
        self,
        topic: str,
        *,
        start: str = "earliest",
        end: str | None = None,
        receiver_queue_size: int = 1000,
    ) -> Reader:
        """A reader of one ``persistent://`` topic or segment from ``start`` (earliest,
        latest, or ``LEDGER:ENTRY``). With ``end`` (``latest``: the last entry stored now, or
        ``LEDGER:ENTRY``, inclusive) it ends once past it: ``reader.ended()``, and
        ``receive`` raises :class:`TopicEnded` when nothing is left."""
        reader = Reader(
            self.connector,
            _topic(topic),
            start=start,
            end=end,
            receiver_queue_size=receiver_queue_size,
        )
        await reader.start()
        self._closables.append(reader)
        return reader

    async def close(self) -> None:
        for closable in reversed(self._closables):
            await closable.close()
        self._closables.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
            self._connector = None
