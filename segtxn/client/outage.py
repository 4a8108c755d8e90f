"""How long a producer's or a consumer's reconnecting has reached no broker, and when its
sends or acknowledgments in flight stop waiting for one.

A broker that cannot be reached (refused, reset, no answer in time) is given the client's
``request_timeout_s`` to come back, counted from the start of the first attempt that could
not reach one (an attempt that got no answer at all is that long by itself). A broker
restarting (a crash, an upgrade) is back within it, and the sends in flight are written
again and de-duplicated, the acknowledgments sent again: nothing is lost, no transaction
with an acknowledgment in flight is doomed. Past it, every send or acknowledgment in flight
fails at once with ConnectionLost, and so does each one made meanwhile at the next attempt
that cannot reach a broker, rather than at its own timeout (``segtxn produce`` and
``segtxn consume`` of a dead broker waited out 30 s). A broker that answers, even to
refuse (a topic moving to another broker, a broker starting), starts the count again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from segtxn.client.unreachable import cannot_reach, why_unreachable
from segtxn.protocol.errors import ServerError

__all__ = ["Outage"]


class Outage:
    """One producer's or stream's reconnecting: ``give_up(why, error)`` fails what it has
    in flight."""

    def __init__(self, grace_s: float, give_up: Callable[[str, BaseException], None]) -> None:
        self._grace_s = grace_s
        self._give_up = give_up
        self._since: float | None = None

    def answered(self) -> None:
        """A broker answered (or the producer is connected again)."""
        self._since = None

    def failed(self, error: BaseException, attempt: float) -> None:
        """An attempt started at ``attempt`` (the loop's time) failed with ``error``."""
        if not cannot_reach(error):
            self._since = None
            return
        if self._since is None:
            self._since = attempt
        if asyncio.get_running_loop().time() - self._since >= self._grace_s:
            said = error.message if isinstance(error, ServerError) else why_unreachable(error)
            self._give_up(f"no broker could be reached for {self._grace_s:g} s ({said})", error)
