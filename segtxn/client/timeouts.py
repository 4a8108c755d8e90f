"""Time limits for every client call, and retrying what is safe to retry until them.

Every public call of the client ends within its timeout, whatever the brokers do (a paused
broker answers nothing, and a TCP connection to it still opens): it returns, or raises the
error it got, or raises :class:`~segtxn.client.errors.Timeout`. The limits are
:class:`Timeouts` (client options) unless a call is given its own ``timeout_s``; the table
of calls and defaults is in docs/protocol.md, "Client time limits".

:func:`retrying` is how calls that are safe to repeat — looking a topic up, attaching a
producer or a consumer, calling a transaction coordinator — get through a broker or the
metadata store restarting: a retriable error (``ServiceNotReady``, ``NotOwner``,
``TooManyRequests``, no connection, no answer within ``request_timeout_s``) is tried again
with back-off until the call's deadline, then the call raises ``Timeout`` naming the last
cause. Anything else is raised at once.

A limit the application gives (every ``timeout_s``, ``send_timeout_s``, the client's
options) is checked by :func:`checked_limit` before the call does anything (every
:class:`Deadline` is built through it): None or a finite number of seconds >= 0 (the
client's options: > 0). ``nan`` (every comparison with it is false: it never expired, or
at once), a negative number, ``inf`` (None says "no limit") and a string are refused with
ValueError or TypeError naming the argument. ``receive(timeout_s=0)`` returns a message
already queued, else raises ``Timeout`` at once.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import numbers
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import aiohttp

from segtxn.client.errors import Timeout
from segtxn.protocol.errors import ErrorCategory, ServerError

log = logging.getLogger(__name__)
T = TypeVar("T")
K = TypeVar("K")

FIRST_RETRY_S = 0.05
MAX_RETRY_S = 1.0
"""Back-off between attempts: doubling from 50 ms, at most 1 s."""
CLOSE_WAIT_S = 1.0
"""How long closing a WebSocket waits for the broker's close frame before dropping it."""


@dataclass(frozen=True)
class Timeouts:
    """The client's time limits (``Client(url, operation_timeout_s=..., ...)``)."""

    operation_timeout_s: float = 30.0
    """Default limit of a call: creating a producer, consumer or reader (lookup and
    connect, retried), an acknowledgment's receipt, a negative ack, a transaction's
    start/commit/abort, an admin call, closing. Pulsar's ``operationTimeout`` (30 s)."""
    request_timeout_s: float = 10.0
    """One attempt of a call that is retried (a lookup, a WebSocket handshake, a coordinator
    call): after this it is given up and tried again, on another broker or coordinator if
    the client knows several, within the call's own limit."""

    def __post_init__(self) -> None:
        for name in ("operation_timeout_s", "request_timeout_s"):
            if not checked_limit(getattr(self, name), name):  # None or 0
                raise ValueError(f"{name} must be a positive number of seconds")

    def limit(self, timeout_s: float | None) -> float:
        """A call's time limit: ``timeout_s``, or the operation timeout when it is None.

        Raises:
            TypeError / ValueError: ``timeout_s`` is not a limit (:func:`checked_limit`).
        """
        checked = checked_limit(timeout_s)
        return self.operation_timeout_s if checked is None else checked


def checked_limit(timeout_s: object, name: str = "timeout_s") -> float | None:
    """``timeout_s`` as a time limit: None (no limit) or a finite number of seconds >= 0.

    Raises:
        TypeError: not a number (a bool is not one either).
        ValueError: nan, infinite or negative.
    """
    if timeout_s is None:
        return None
    if type(timeout_s) not in (float, int) and (  # (every send checks one: no ABC check then)
        isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real)
    ):
        raise TypeError(
            f"{name} is a number of seconds or None (no limit), not {type(timeout_s).__name__}"
        )
    seconds = float(timeout_s)  # type: ignore[arg-type]  # a Real, checked above
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(
            f"{name} must be a finite number of seconds >= 0, or None for no limit; "
            f"got {timeout_s!r}"
        )
    return seconds


class Deadline:
    """When a call must be done by, in event-loop time (``None``: no limit).

    Raises TypeError / ValueError for a ``timeout_s`` that is not a limit
    (:func:`checked_limit`): a call builds its deadline before it does anything."""

    def __init__(self, timeout_s: float | None) -> None:
        timeout_s = checked_limit(timeout_s)
        self.timeout_s = timeout_s
        self.at = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s

    def remaining(self) -> float | None:
        """Seconds left (never negative), or None without a limit."""
        if self.at is None:
            return None
        return max(0.0, self.at - asyncio.get_running_loop().time())

    def expired(self) -> bool:
        remaining = self.remaining()
        return remaining is not None and remaining <= 0

    def cap(self, limit_s: float | None) -> float | None:
        """The smaller of what is left and ``limit_s`` (None: no limit on either)."""
        remaining = self.remaining()
        if remaining is None:
            return limit_s
        return remaining if limit_s is None else min(remaining, limit_s)

    def timeout(self) -> asyncio.Timeout:
        """``async with deadline.timeout(): ...`` (raises the builtin TimeoutError)."""
        return asyncio.timeout_at(self.at)

    def __str__(self) -> str:
        return "no limit" if self.timeout_s is None else f"{self.timeout_s:g} s"


class Expiries(Generic[K]):
    """The deadlines of many pending things under one timer.

    A producer may have thousands of sends in flight; a ``TimerHandle`` each (created, then
    cancelled when the receipt comes) was a fifth of a producing client's CPU. Here each
    deadline is a heap entry, one timer waits for the earliest, and ``expire(key)`` is
    called for every key whose deadline has passed — also for keys settled meanwhile, so
    ``expire`` must ignore those. Entries of settled keys are dropped lazily: at their
    deadline, or when they outnumber the live ones (``alive``)."""

    def __init__(self, expire: Callable[[K], None], alive: Callable[[K], bool]) -> None:
        self._expire = expire
        self._alive = alive
        self._heap: list[tuple[float, int, K]] = []
        self._order = 0  # ties broken by insertion, so keys never need to compare
        self._live_hint = 0
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, at: float, key: K) -> None:
        """Call ``expire(key)`` at loop time ``at`` (unless :meth:`clear` comes first)."""
        self._order += 1
        heapq.heappush(self._heap, (at, self._order, key))
        if len(self._heap) > 2 * self._live_hint + 1024:
            self._compact()
        if self._timer is None or at < self._timer.when():
            self._arm(self._heap[0][0])

    def clear(self) -> None:
        """Forget every deadline (the owner has failed or settled everything)."""
        self._heap.clear()
        self._live_hint = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _compact(self) -> None:
        self._heap = [entry for entry in self._heap if self._alive(entry[2])]
        heapq.heapify(self._heap)
        self._live_hint = len(self._heap)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        while self._heap and self._heap[0][0] <= now:
            _, _, key = heapq.heappop(self._heap)
            self._expire(key)
        if self._heap and self._timer is None:
            self._arm(self._heap[0][0])


def describe(error: BaseException | None) -> str:
    if error is None:
        return "no attempt finished"
    if isinstance(error, TimeoutError) and not str(error):
        return "no answer in time"
    return f"{type(error).__name__}: {error}" if not isinstance(error, ServerError) else str(error)


async def retrying(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    deadline: Deadline,
    *,
    request_timeout_s: float,
    category: ErrorCategory = ErrorCategory.RETRIABLE,
    busy: tuple[type[ServerError], ...] = (),
) -> T:
    """Run ``attempt`` until it succeeds, each try within ``request_timeout_s`` and all of
    them before ``deadline``; back off between tries.

    Args:
        what: the call, for the timeout's message ("create a producer on ...").
        category: the Timeout's category (RETRIABLE: nothing was done; OUTCOME_UNKNOWN: an
            attempt may have taken effect).
        busy: errors retried only after an earlier attempt was abandoned (``ProducerBusy``:
            the broker may still hold the attempt we gave up on).

    Raises:
        Timeout: the deadline passed; ``last_error`` is the last retriable failure.
        ServerError: a failure that is not retriable.
    """
    delay = FIRST_RETRY_S
    last: BaseException | None = None
    abandoned = False
    while True:
        limit = deadline.cap(request_timeout_s)
        if limit is not None and limit <= 0:
            raise Timeout(
                f"{what}: not done within {deadline} (last: {describe(last)})",
                category=category,
                last_error=last,
            ) from last
        try:
            async with asyncio.timeout(limit) as scope:
                return await attempt()
        except TimeoutError as e:  # ours (the attempt was abandoned), or one from below
            abandoned = abandoned or scope.expired()
            last = e
        except ServerError as e:
            if not (e.retriable or (abandoned and isinstance(e, busy))):
                raise
            last = e
        except (aiohttp.ClientError, ConnectionError) as e:
            last = e
        log.debug("%s: %s; trying again", what, describe(last))
        pause = deadline.cap(delay)
        await asyncio.sleep(pause or 0)  # back off before the next attempt
        delay = min(delay * 2, MAX_RETRY_S)


async def close_quietly(closing: Awaitable[object], limit_s: float = CLOSE_WAIT_S) -> None:
    """Await a WebSocket's ``close()`` for at most ``limit_s`` (cancelling it drops the
    connection at once); a broker that does not answer does not hold the caller."""
    try:
        async with asyncio.timeout(limit_s):
            await closing
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as e:
        log.debug("closing a WebSocket: %s (dropped)", describe(e))
