"""Readers: the messages of one topic or segment from a start position, without a
subscription (nothing is acknowledged; committed data only). A scalable topic is many
segments: it is read whole by a :class:`~segtxn.client.checkpoint.CheckpointConsumer`.

``receive`` waits as long as it takes unless given ``timeout_s``; closing the reader ends it
at once (ClientClosed), as it does a consumer's.
"""

from __future__ import annotations

import asyncio

from segtxn.client.closables import Closable
from segtxn.client.connection import Connector
from segtxn.client.errors import ClientClosed, TopicEnded
from segtxn.client.messages import Message
from segtxn.client.queues import close_queue, next_item
from segtxn.client.stream import MessageStream
from segtxn.client.timeouts import Deadline
from segtxn.protocol.names import TopicName

__all__ = ["Reader"]


class Reader(Closable):
    """Messages of one topic or segment from a start position, without a subscription."""

    def __init__(
        self,
        connector: Connector,
        topic: TopicName,
        *,
        start: str = "earliest",
        end: str | None = None,
        receiver_queue_size: int = 1000,
    ) -> None:
        self._queue: asyncio.Queue[Message | BaseException] = asyncio.Queue(
            maxsize=receiver_queue_size + 8
        )
        query = {"start": start} if end is None else {"start": start, "end": end}
        self._stream = MessageStream(
            connector,
            topic,
            kind="reader",
            suffix="",
            query=query,
            receiver_queue_size=receiver_queue_size,
            deliver=self._queue,
            on_end=self._ended,
        )
        self._closed = False

    def _ended(self) -> None:
        # after every message (one WebSocket, in order); kept across reconnects like errors
        self._queue.put_nowait(TopicEnded(f"{self._stream.topic}: nothing more to read"))

    async def start(self, deadline: Deadline) -> None:
        """Attach, retrying until ``deadline`` (Timeout after it)."""
        await self._stream.start(deadline)

    def ended(self) -> bool:
        return self._stream.ended.is_set()

    async def receive(self, timeout_s: float | None = None) -> Message:
        """The next message.

        Args:
            timeout_s: how long to wait for one: None (the default) as long as it takes; 0
                only for one already here; else a finite number of seconds.

        Raises:
            TypeError / ValueError: ``timeout_s`` is not None or a finite number >= 0.
            TopicEnded: everything was read (sealed topic, or past ``end``); raised again on
                every later call.
            Timeout: none arrived within ``timeout_s`` (RETRIABLE; also a TimeoutError).
            ServerError / CertificateError: reconnecting failed for good (the topic was
                deleted; a broker certificate the client does not trust); raised again on
                every later call.
            ClientClosed: the reader was closed, before the call or while it waited.
        """
        self._check_open()
        item = await next_item(self._queue, timeout_s, f"reader of {self._stream.topic}")
        self._check_open()  # closed while a message was on its way to this receive
        if isinstance(item, BaseException):
            # it stays: the end, or the failure that ended the reader's one stream (it no
            # longer reconnects, so a later receive would otherwise wait for nothing)
            self._queue.put_nowait(item)
            raise item
        await self._stream.taken()
        return item

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"reader of {self._stream.topic} is closed")

    async def close(self) -> None:
        """Detach (at most 1 s); a ``receive`` waiting raises ClientClosed at once.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        close_queue(self._queue, ClientClosed(f"reader of {self._stream.topic} is closed"))
        await self._stream.close()
        self._close_done()
