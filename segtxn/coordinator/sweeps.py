"""The coordinators' periodic sweeps (v5: timeouts and header GC; v4: timeouts), each a loop
that a failed round never ends.

Why a module of its own: every sweep is the only thing that ever ends what it sweeps (an OPEN
transaction whose client went away is aborted by the timeout sweep, or never; a final header
is deleted by the GC sweep, or never), so a sweep loop that stops is a silent, permanent
fault. Each coordinator caught only the errors it expected (v4: ``ServerError``; v5:
``MetadataStoreError``); anything else (the other one of the two, a ledger error, a bug)
ended the loop without a word, and v5 ran both of its sweeps in one race, so a failed GC
round stopped the timeouts too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from segtxn.coordinator.retry import BACKOFF_MAX_S, log_failure

__all__ = ["BACKOFF_MAX_S", "every"]


async def every(what: str, period_s: float, sweep: Callable[[], Awaitable[object]]) -> None:
    """Run ``sweep`` every ``period_s`` seconds until cancelled; never returns otherwise.

    A round that fails is logged and the loop goes on (:mod:`segtxn.coordinator.retry`): a
    store, server or ledger error (the store or a participant away, an id moving) at
    WARNING, anything else (a bug) at ERROR with its traceback. After a failure the pause
    doubles, up to ``BACKOFF_MAX_S`` (or the period, when longer), so a fault that lasts is
    neither hammered nor logged at the sweep's rate; the first round that succeeds restores
    the period. Cancellation (the coordinator stopping) is not caught: ``CancelledError`` is
    no ``Exception``.

    Args:
        what: the sweep's name, for the log.
        period_s: the pause between rounds while they succeed.
        sweep: one round.
    """
    pause = period_s
    failed = 0
    while True:
        await asyncio.sleep(pause)  # a sweep interval, not a wait for a condition
        try:
            await sweep()
        except Exception as e:
            failed += 1
            pause = min(pause * 2, max(period_s, BACKOFF_MAX_S))
            log_failure(what, e, failed, pause)
        else:
            pause, failed = period_s, 0
