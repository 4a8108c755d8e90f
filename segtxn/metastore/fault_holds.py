"""The parked calls of the fault injector (:mod:`segtxn.metastore.faults`): answers or
calls held until the test lets them go (:class:`Hold`), and writes failed to their callers
now and applied when the test lets them go (:class:`Late`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from segtxn.metastore.engine import TxnResult

_Call = asyncio.Future[None]
"""One held call: its answer goes on once this is done."""


class Hold:
    """The answers (or, ``before``, the calls) parked by one :meth:`FaultInjector.hold`.
    Operations are numbered in the order they were *called* (from 0), whatever order the
    backend answers in."""

    def __init__(
        self, operation: str, key_prefix: bytes | None, times: int | None, before: bool
    ) -> None:
        self.operation = operation
        self.key_prefix = key_prefix
        self.times = times
        self.before = before
        """Park the call before the backend applies it, not its answer after."""
        self._calls: list[_Call] = []
        self._parked = 0
        self._arrival = asyncio.Event()

    @property
    def parked(self) -> int:
        """How many answers are (or were) parked so far."""
        return self._parked

    async def wait_for(self, count: int, *, timeout_s: float = 10.0) -> None:
        """Return once ``count`` answers are parked.

        Raises:
            TimeoutError: fewer were parked within ``timeout_s``.
        """
        async with asyncio.timeout(timeout_s):
            while self._parked < count:
                self._arrival.clear()
                await self._arrival.wait()

    def release(self, *calls: int) -> None:
        """Let the answers of ``calls`` (call numbers) go on, in the order given; with no
        number, every call so far, in call order. The callers resume in that order."""
        for call in calls or range(len(self._calls)):
            if not self._calls[call].done():
                self._calls[call].set_result(None)

    def _claim(self, operation: str, keys: Sequence[bytes]) -> _Call | None:
        if operation != self.operation or self.times == 0:
            return None
        if self.key_prefix is not None and not any(k.startswith(self.key_prefix) for k in keys):
            return None
        if self.times is not None:
            self.times -= 1
        call: _Call = asyncio.get_running_loop().create_future()
        self._calls.append(call)
        return call

    async def _park(self, call: _Call) -> None:
        self._parked += 1
        self._arrival.set()
        await call


class Late:
    """The writes taken by one :meth:`FaultInjector.apply_late`: each failed to its caller
    and waits to be applied until :meth:`release`."""

    def __init__(self, key_prefix: bytes | None, times: int | None) -> None:
        self.key_prefix = key_prefix
        self.times = times
        self._released = asyncio.Event()
        self._writes: list[asyncio.Task[TxnResult]] = []

    @property
    def taken(self) -> int:
        """How many writes were failed to their callers so far."""
        return len(self._writes)

    def release(self) -> None:
        """Let the writes taken so far, and any taken later, reach the backend."""
        self._released.set()

    async def applied(self) -> list[TxnResult]:
        """Release the writes and return the backend's answers once all were applied."""
        self.release()
        return list(await asyncio.gather(*self._writes))

    def _take(self, keys: Sequence[bytes], apply: Callable[[], Awaitable[TxnResult]]) -> bool:
        if self.times == 0:
            return False
        if self.key_prefix is not None and not any(k.startswith(self.key_prefix) for k in keys):
            return False
        if self.times is not None:
            self.times -= 1

        async def later() -> TxnResult:
            await self._released.wait()
            return await apply()

        self._writes.append(asyncio.create_task(later(), name="fault-late-write"))
        return True
