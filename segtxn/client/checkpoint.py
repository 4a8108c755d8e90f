"""Reading a scalable topic with positions the application keeps, not the broker.

A :class:`CheckpointConsumer` is a :class:`~segtxn.client.consumer.Consumer` that follows
the segment DAG the same way (a child after its parents are read to their end) with
readers instead of a subscription: nothing is acknowledged, and :meth:`checkpoint` says
where it stands. Its checkpoint names only segments the topic still has (a segment pruned
from the DAG is forgotten), so it stays as small as the live DAG over months of splits and
merges.
"""

from __future__ import annotations

from typing import Any

from segtxn.client.connection import Connector
from segtxn.client.consumer import Consumer
from segtxn.client.errors import ClientError
from segtxn.client.layout import TopicLayout
from segtxn.client.messages import Message, MessageId
from segtxn.client.stream import MessageStream
from segtxn.client.transaction import Transaction
from segtxn.protocol.names import TopicName

__all__ = ["CheckpointConsumer"]


class CheckpointConsumer(Consumer):
    """Reads a scalable topic with positions held by the application, not the broker.

    Segments are read in DAG order (a child after its parents are read to their end), with
    readers: nothing is acknowledged. :meth:`checkpoint` returns a JSON-serializable dict of
    where every segment is; a consumer created with it resumes there — after splits and
    merges too: segments finished stay finished, new ones start at their beginning.
    Delivery is at least once from a checkpoint (messages received after it come again).
    """

    def __init__(
        self,
        connector: Connector,
        topic: TopicName,
        layout: TopicLayout,
        checkpoint: dict[str, Any] | None = None,
        *,
        receiver_queue_size: int = 1000,
    ) -> None:
        super().__init__(
            connector,
            topic,
            "checkpoint",
            sub_type="Exclusive",
            receiver_queue_size=receiver_queue_size,
            layout=layout,
        )
        saved = checkpoint or {}
        self._positions: dict[int, str] = {int(k): v for k, v in saved.get("next", {}).items()}
        self._finished = {int(s) for s in saved.get("finished", [])}

    def _new_stream(self, topic: TopicName) -> MessageStream:
        start = self._positions.get(topic.segment or 0, "earliest")
        return MessageStream(
            self._connector,
            topic,
            kind="reader",
            suffix="",
            query={"start": start},
            receiver_queue_size=self._size,
            deliver=self._queue,
            on_end=self._wake.set,
        )

    async def receive(self, timeout_s: float | None = None) -> Message:
        message = await super().receive(timeout_s)
        segment = TopicName.parse(message.message_id.topic).segment or 0
        self._positions[segment] = (
            f"{message.message_id.ledger_id}:{message.message_id.entry_id + 1}"
        )
        return message

    def _forget_pruned(self) -> None:
        """Also forget where reading stood in segments that left the DAG (a checkpoint
        names only segments the topic still has: it stays as small as the live DAG)."""
        super()._forget_pruned()
        assert self._layout is not None
        self._positions = {s: at for s, at in self._positions.items() if not self._layout.pruned(s)}

    def checkpoint(self) -> dict[str, Any]:
        """Where reading stands: ``{"next": {segment: "L:E"}, "finished": [segment, ...]}``.

        Segments pruned from the topic's DAG are left out (a restored checkpoint that
        still names some is fine: they are forgotten at once, as nothing reads them)."""
        self._forget_pruned()
        return {
            "next": {str(k): v for k, v in sorted(self._positions.items())},
            "finished": sorted(self._finished),
        }

    async def acknowledge(
        self,
        message: Message | MessageId,
        *,
        txn: Transaction | None = None,
        timeout_s: float | None = None,
    ) -> None:
        raise ClientError("a checkpoint consumer acknowledges nothing: keep its checkpoint()")
