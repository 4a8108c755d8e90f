"""Bounded waiting for tests: never a fixed sleep, always a condition and a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal, TypeVar

from segtxn.client import ClientError
from segtxn.metastore import Compacted, MetadataStore

T = TypeVar("T")


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]], *, timeout: float = 10.0, what: str = ""
) -> None:
    """Re-check ``condition`` until it holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await asyncio.sleep(0.005)  # sleep-ok: the poll interval of a bounded wait-until


async def take(events: AsyncIterator[T], n: int, *, timeout: float = 10.0) -> list[T]:
    """The next ``n`` items of an async iterator, or fail after ``timeout`` seconds."""
    out: list[T] = []

    async def collect() -> None:
        async for item in events:
            out.append(item)
            if len(out) == n:
                return

    try:
        await asyncio.wait_for(collect(), timeout)
    except TimeoutError:
        raise AssertionError(f"got {len(out)} of {n} items in {timeout}s: {out!r}") from None
    return out


PROBE = "/compaction-probe"


async def wait_compacted(store: MetadataStore, revision: int, *, timeout: float = 15.0) -> None:
    """Wait until the store has compacted ``revision`` away: a watch from it fails with
    ``Compacted``. Writes one probe record (at ``PROBE``) so a watch from ``revision``
    that still has its history answers at once, with the probe."""
    probe = await store.put(PROBE, b"")
    if probe.version < revision:
        raise ValueError(f"revision {revision} is in the future (the store is at {probe.version})")

    async def gone() -> bool:
        try:
            async with store.watch(PROBE, from_revision=revision) as events:
                await anext(events)  # the probe, while the history lasts
        except Compacted:
            return True
        return False

    await wait_until(gone, timeout=timeout, what=f"revision {revision} compacted")


class ContendedLock(asyncio.Lock):
    """A lock that says when a task has to wait for it."""

    def __init__(self) -> None:
        super().__init__()
        self.contended = asyncio.Event()

    async def acquire(self) -> Literal[True]:
        if self.locked():
            self.contended.set()
        return await super().acquire()


async def client_error_of(call: Awaitable[object], *, within_s: float, what: str) -> ClientError:
    """The ClientError ``call`` fails with, which it must do within ``within_s``.

    Raises:
        AssertionError: it succeeded (``what`` names it in the message).
        TimeoutError: it had not ended by then.
    """
    try:
        async with asyncio.timeout(within_s):
            await call
    except ClientError as e:
        return e
    raise AssertionError(f"{what} succeeded")
