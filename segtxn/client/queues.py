"""The receive queue of a consumer or a reader: what its stream delivers (messages, and
errors that end the receiving), taken by ``receive`` within its limit; closing the owner
wakes every ``receive`` waiting on it."""

from __future__ import annotations

import asyncio
import contextlib

from segtxn.client.errors import ClientClosed, Timeout
from segtxn.client.messages import Message
from segtxn.client.timeouts import Deadline
from segtxn.protocol.errors import ErrorCategory

__all__ = ["close_queue", "next_item"]


async def next_item(
    queue: asyncio.Queue[Message | BaseException], timeout_s: float | None, who: str
) -> Message | BaseException:
    """The next item of a receive queue, within ``timeout_s`` (None: no limit; 0: only
    one already queued).

    Raises:
        Timeout: none came (RETRIABLE).
        ClientClosed: the queue's consumer or reader was closed (:func:`close_queue`).
        TypeError / ValueError: ``timeout_s`` is not a limit (nan, negative, a string, ...).
    """
    deadline = Deadline(timeout_s)
    if not queue.empty():  # one already queued: returned before any timeout, without a timer
        item = queue.get_nowait()
    else:
        try:
            async with deadline.timeout():
                item = await queue.get()
        except TimeoutError as e:
            raise Timeout(
                f"{who}: no message within {deadline}", category=ErrorCategory.RETRIABLE
            ) from e
    if isinstance(item, ClientClosed):
        close_queue(queue, item)  # it stays, for the next receive waiting
        raise ClientClosed(str(item))
    return item


def close_queue(queue: asyncio.Queue[Message | BaseException], closed: ClientClosed) -> None:
    """The consumer or reader of ``queue`` closed: every receive waiting on it raises
    ``closed`` now (each puts it back for the next). A full queue has no receive waiting,
    and a receive that starts later sees its owner closed before it looks at the queue."""
    with contextlib.suppress(asyncio.QueueFull):
        queue.put_nowait(closed)
