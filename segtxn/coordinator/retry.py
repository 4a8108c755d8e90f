"""What a coordinator's background loop does with a failure: log it, pause, and go on.

Each of these loops is the only thing doing its job: campaigning for a coordinator id and
taking its log over (v4 ``HeldLogs._hold``; v5 ``HeldIds._hold``), registering again once
the session expired (``HeldIds._keep_registered``), finishing a decided transaction (v4
``_resume``), and the sweeps (:func:`segtxn.coordinator.sweeps.every`). Nobody awaits their
tasks, so one that ends on an error it did not expect ends silently (asyncio logs "Task
exception was never retrieved", at best, once the task is collected) and nothing restarts
it: the coordinator stops holding an id for good (a v4 id it won stays its own, and nobody
else can take it), never registers again, or leaves a transaction half finished for ever.
So every failure is caught, logged and retried:

- an *expected* one (:data:`EXPECTED`: the store or a participant away, an id moving, a
  ledger failing) at WARNING, at the loop's own pace (``pause_s``, doubling up to
  ``expected_max_s``);
- anything else (a bug, a damaged record) at ERROR with its traceback, the pause doubling
  up to :data:`BACKOFF_MAX_S`, so an error that comes back at once does not flood the log.

Cancellation (the coordinator stopping) is never caught: ``CancelledError`` is no
``Exception``.
"""

from __future__ import annotations

import asyncio
import logging

from segtxn.stopping import EXPECTED, expected

__all__ = ["BACKOFF_MAX_S", "EXPECTED", "Retry", "expected", "log_failure", "log_step_failure"]

log = logging.getLogger(__name__)

BACKOFF_MAX_S = 10.0
"""The longest pause after failures in a row of an unexpected error (a sweep: of any)."""


def log_failure(what: str, e: Exception, failed: int, pause_s: float) -> None:
    """Log the ``failed``-th failure in a row of ``what``: WARNING for an expected error,
    ERROR with the traceback for anything else."""
    ok = expected(e)
    log.log(
        logging.WARNING if ok else logging.ERROR,
        "%s failed (%d in a row): %s: %s; tried again in %.1f s",
        what, failed, type(e).__name__, e, pause_s,
        exc_info=not ok,
    )  # fmt: skip


def log_step_failure(what: str, e: Exception) -> None:
    """Log ``e``, the failure of ``what``: a step a loop goes on after without trying it
    again (closing a log it lost, letting an id go), so it is not counted as the loop's
    failure. WARNING for an expected error, ERROR with the traceback for anything else."""
    ok = expected(e)
    log.log(
        logging.WARNING if ok else logging.ERROR,
        "%s failed: %s: %s", what, type(e).__name__, e,
        exc_info=not ok,
    )  # fmt: skip


class Retry:
    """The failures in a row of one loop, and the pause after each.

    The n-th failure in a row pauses ``pause_s * 2 ** (n - 1)``, at most ``expected_max_s``
    (default: ``pause_s``, a steady pace) for an expected error and at most
    :data:`BACKOFF_MAX_S` (or ``expected_max_s`` when longer) for any other.
    """

    def __init__(self, what: str, pause_s: float, expected_max_s: float | None = None) -> None:
        self.what = what
        self.pause_s = pause_s
        self.expected_max_s = pause_s if expected_max_s is None else expected_max_s
        self.failed = 0
        """Failures in a row (0 after a success)."""

    def reset(self) -> None:
        """The loop's step succeeded: the next failure pauses ``pause_s`` again."""
        self.failed = 0

    def pause_after(self, e: Exception) -> float:
        """Count and log the failure ``e``; return how long to pause before trying again."""
        self.failed += 1
        cap = self.expected_max_s if expected(e) else max(BACKOFF_MAX_S, self.expected_max_s)
        pause: float = min(self.pause_s * 2.0 ** min(self.failed - 1, 30), cap)
        log_failure(self.what, e, self.failed, pause)
        return pause

    async def after(self, e: Exception) -> None:
        """Count and log the failure ``e``, then pause."""
        await asyncio.sleep(self.pause_after(e))  # the cause is away or broken: a pace
