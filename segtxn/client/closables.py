"""What a client has open: the producers, consumers and readers it made and that are not
closed yet, so that ``Client.close()`` closes them.

Each one tells the client once its own ``close()`` has done its work, and the client
forgets it: a long-lived client that makes and closes one per request kept every one it
ever made (their buffers, queues and streams), growing without bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Closable", "OpenSet"]


class Closable:
    """A mixin for what a client keeps until it is closed: its ``close()`` calls
    :meth:`_close_done` when it has done its work (not when it raised or was cancelled:
    then the client's ``close()`` tries again)."""

    _on_closed: Callable[[], None] | None = None

    def _close_done(self) -> None:
        on_closed, self._on_closed = self._on_closed, None
        if on_closed is not None:
            on_closed()


C = TypeVar("C", bound=Closable)


class OpenSet(Generic[C]):
    """The open ones, in the order they were made."""

    def __init__(self) -> None:
        self._open: dict[C, None] = {}  # a dict: ordered, and removal is O(1)

    def add(self, closable: C) -> None:
        """Keep ``closable`` until its ``close()`` has done its work."""
        self._open[closable] = None
        closable._on_closed = lambda: self._open.pop(closable, None)

    def newest_first(self) -> list[C]:
        """The open ones, the last made first (a copy: closing them removes them)."""
        return list(reversed(self._open))

    def clear(self) -> None:
        self._open.clear()
