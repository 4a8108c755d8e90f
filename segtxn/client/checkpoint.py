"""Reading a scalable topic with positions the application keeps, not the broker.

A :class:`CheckpointConsumer` is a :class:`~segtxn.client.consumer.Consumer` that follows
the segment DAG the same way (a child after its parents are read to their end) with
readers instead of a subscription: nothing is acknowledged, and :meth:`checkpoint` says
where it stands. Its checkpoint names only segments the topic still has (a segment pruned
from the DAG is forgotten), so it stays as small as the live DAG over months of splits and
merges.
"""

from __future__ import annotations

import re
from typing import Any

from segtxn.client.connection import Connector
from segtxn.client.consumer import Consumer
from segtxn.client.errors import ClientError
from segtxn.client.layout import TopicLayout
from segtxn.client.messages import Message, MessageId
from segtxn.client.stream import MessageStream
from segtxn.client.transaction import Transaction
from segtxn.protocol.names import TopicName

__all__ = ["CheckpointConsumer", "read_checkpoint"]

_POSITION = re.compile(r"[0-9]{1,19}:[0-9]{1,19}", re.ASCII)
_SEGMENT = re.compile(r"[0-9]{1,18}", re.ASCII)


def read_checkpoint(checkpoint: dict[str, Any] | None) -> tuple[dict[int, str], set[int]]:
    """What :meth:`CheckpointConsumer.checkpoint` returned: where each segment's reading
    goes on, and the segments finished.

    Raises:
        ValueError: it is not one (naming what is wrong): read as empty, it would read the
            topic again from its start, without a word.
    """
    if checkpoint is None:
        return {}, set()
    if not isinstance(checkpoint, dict) or set(checkpoint) - {"next", "finished"}:
        raise ValueError(
            "a checkpoint is a dict of 'next' and 'finished' (what checkpoint() returns), not "
            f"{_shown(checkpoint)}"
        )
    positions = checkpoint.get("next", {})
    finished = checkpoint.get("finished", [])
    if not isinstance(positions, dict) or not all(
        isinstance(k, str)
        and _SEGMENT.fullmatch(k)
        and isinstance(v, str)
        and _POSITION.fullmatch(v)
        for k, v in positions.items()
    ):
        raise ValueError(
            'a checkpoint\'s \'next\' maps segment ids to positions ({"0": "3:12"}), not '
            f"{_shown(positions)}"
        )
    if not isinstance(finished, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in finished
    ):
        raise ValueError(
            f"a checkpoint's 'finished' lists segment ids ([0, 1]), not {_shown(finished)}"
        )
    return {int(k): v for k, v in positions.items()}, set(finished)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
        self._positions, self._finished = read_checkpoint(checkpoint)

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
