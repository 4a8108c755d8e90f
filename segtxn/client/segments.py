"""Following a scalable topic's segment DAG for a consumer: which segments it reads, and
when. Segments are opened as the DAG grows and as their parents finish (on an ordered
subscription a child waits until every parent was consumed and acknowledged to its end:
per-key order across splits and merges); one that ended is closed once its last acks are
confirmed, and segments pruned from the DAG are forgotten.

It is apart from :mod:`segtxn.client.consumer` because it is a different concern from
receiving and acknowledging: it decides which streams exist, never what flows on them.
:class:`SegmentFollowing` holds the consumer's side of it; both
:class:`~segtxn.client.consumer.Consumer` and its
:class:`~segtxn.client.checkpoint.CheckpointConsumer` build on it (the latter forgets its
positions in pruned segments too, through ``_forget_pruned``).
"""

from __future__ import annotations

import asyncio
import logging

from segtxn.aio import first_completed
from segtxn.client.connection import Connector
from segtxn.client.errors import Timeout, TopicNotFound
from segtxn.client.layout import TopicLayout
from segtxn.client.messages import Message
from segtxn.client.stream import MessageStream
from segtxn.client.timeouts import FIRST_RETRY_S, Deadline
from segtxn.protocol.errors import ServerError
from segtxn.protocol.names import TopicName

__all__ = ["ACK_SETTLE_S", "SegmentFollowing"]

# its lines are the consumer's story (they name the consumer): they keep its logger
log = logging.getLogger("segtxn.client.consumer")

ACK_SETTLE_S = 10.0  # how long a finished segment waits for its last acks to be confirmed


class SegmentFollowing:
    """A consumer's following of its scalable topic's segment DAG (``_layout`` set). The
    consumer sets the attributes below and opens each stream (:meth:`_open`)."""

    name: str
    topic: TopicName
    _connector: Connector
    _layout: TopicLayout | None
    _ordered: bool
    _streams: dict[str, MessageStream]
    _finished: set[int]
    """Segments consumed and acknowledged to their end (their streams are closed)."""
    _wake: asyncio.Event
    """Set when a stream ends (its ``on_end``)."""
    _queue: asyncio.Queue[Message | BaseException]

    async def _open(self, topic: TopicName, deadline: Deadline) -> None:
        """Open and start the consumer's stream on ``topic`` (a segment), by ``deadline``."""
        raise NotImplementedError

    async def _touch(self, topic: TopicName, deadline: Deadline) -> None:
        """Make sure the subscription exists on ``topic`` (a segment), by ``deadline``,
        without reading it."""
        raise NotImplementedError

    async def _create_ahead(self, deadline: Deadline) -> None:
        """(An ordered subscription from the latest position, being attached) Create it now
        on the segments it reads only later (their parents first), so that what is sent to
        them from now on is delivered once they are read. Created when first read, a
        segment's subscription began at its latest position then: what was sent to it
        between ``subscribe()`` and that moment was never delivered. Segments made later by
        a split or merge take the subscription from their parents."""
        assert self._layout is not None
        for segment in sorted(self._layout.segments.values(), key=lambda s: s.id):
            name = self.topic.segment_name(segment.id)
            if str(name) in self._streams or segment.id in self._finished or segment.retired:
                continue
            await self._touch(name, deadline)

    def _forget_pruned(self) -> None:
        """Forget the segments that have left the DAG (retired, then pruned): over months
        of splits and merges the finished set would grow with every one. Safe: a pruned
        segment is read by nobody again (its broker refuses it, its data is deleted), and
        no segment lists it as a parent any more, so no child waits for it."""
        assert self._layout is not None
        self._finished = {s for s in self._finished if not self._layout.pruned(s)}

    async def _open_eligible(self, deadline: Deadline) -> None:
        assert self._layout is not None
        self._forget_pruned()
        for segment in sorted(self._layout.segments.values(), key=lambda s: s.id):
            name = self.topic.segment_name(segment.id)
            if str(name) in self._streams or segment.id in self._finished:
                continue
            if segment.retired:  # every subscription consumed it; its data is gone
                self._finished.add(segment.id)
                continue
            if self._ordered and not all(p in self._finished for p in segment.parents):
                continue  # its parents first: per-key order
            try:
                await self._open(name, deadline)
            except TopicNotFound:
                if segment.active:
                    raise
                # A sealed segment gone since this layout was read was retired: consumed
                # by every subscription and deleted by retention (a deleted topic's
                # active segments refuse next).
                log.info("consumer %s: %s was retired; counted done", self.name, name)
                self._finished.add(segment.id)

    async def _follow(self) -> None:
        """Open segments as the DAG grows and as parents finish; close finished ones. A
        segment that cannot be attached yet is tried again, backing off; one refused for
        good ends the consumer's stream of messages with that error."""
        assert self._layout is not None
        delay = 0.0
        while True:
            if delay:
                await asyncio.sleep(delay)  # back off: attaching a segment failed
            else:
                await first_completed(
                    self._layout.changed.wait(),
                    self._wake.wait(),
                    name=f"consumer-dag-{self.name}",
                )
            self._wake.clear()
            failed = self._layout.failed
            if failed is not None:  # no new segment will be known
                log.warning("consumer %s stops following %s: %s", self.name, self.topic, failed)
                await self._queue.put(failed)  # receive() raises it after what is queued
                return
            for key, stream in list(self._streams.items()):
                # Ended: sealed, and everything in it delivered and acknowledged by the
                # subscription (on every subscription type): nothing more will come on it,
                # and an open stream would keep the segment loaded on its broker for good.
                if stream.ended.is_set():
                    self._finished.add(TopicName.parse(key).segment or 0)
                    del self._streams[key]
                    await stream.settle_acks(ACK_SETTLE_S)  # its last acks' receipts
                    await stream.close()
            try:
                await self._open_eligible(Deadline(self._connector.timeouts.operation_timeout_s))
                delay = 0.0
            except (Timeout, ServerError) as e:
                if isinstance(e, ServerError) and not e.retriable:
                    log.warning("consumer %s stops following %s: %s", self.name, self.topic, e)
                    await self._queue.put(e)  # receive() raises it after what is queued
                    return
                log.warning("consumer %s: %s; trying again", self.name, e)
                delay = min(max(delay * 2, FIRST_RETRY_S), 2.0)
