"""Small asyncio helpers shared by every layer.

Racing two waits (an event stream against a session's expiry, say) is easy to get wrong:
a losing ``anext()`` future left behind keeps a generator half-driven and leaks a task.
:func:`first_completed` runs each coroutine as an owned, named task, and before it returns
it cancels the losers *and waits for them to finish*.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


async def first_completed(*coroutines: Coroutine[Any, Any, Any], name: str = "race") -> int:
    """Run ``coroutines`` concurrently until one finishes; return its position.

    The others are cancelled and awaited before this returns. If the first to finish
    raised, that exception propagates (after the cleanup).
    """
    tasks = [asyncio.create_task(coro, name=f"{name}-{i}") for i, coro in enumerate(coroutines)]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    winner = next(i for i, task in enumerate(tasks) if task in done)
    error = tasks[winner].exception()
    if error is not None:
        raise error
    return winner
