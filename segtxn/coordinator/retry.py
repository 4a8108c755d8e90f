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
  up to :data:`BACKOFF_MAX_S`.

A failure that lasts is said once, not at every try: the first of a row, and then one of
the same kind (its class, and its wire name) at most every :data:`WARN_EVERY_S`, at that
level; a failure of another kind at once; the others at DEBUG. The first success after
failures is one INFO line. (Every try was a WARNING: a participant's lasting failure gave
one every ~2 s for each transaction stuck on it, so many transactions stuck on one damaged
cursor flooded the log.)

Cancellation (the coordinator stopping) is never caught: ``CancelledError`` is no
``Exception``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from segtxn.stopping import EXPECTED, expected

__all__ = [
    "BACKOFF_MAX_S",
    "EXPECTED",
    "WARN_EVERY_S",
    "Retry",
    "expected",
    "log_failure",
    "log_step_failure",
]

log = logging.getLogger(__name__)

BACKOFF_MAX_S = 10.0
"""The longest pause after failures in a row of an unexpected error (a sweep: of any)."""
WARN_EVERY_S = 60.0
"""At most one WARNING (ERROR) this often for failures of one kind in a row of a
:class:`Retry`; the others are DEBUG lines."""


def log_failure(
    what: str, e: Exception, failed: int, pause_s: float, *, quiet: bool = False
) -> None:
    """Log the ``failed``-th failure in a row of ``what``: WARNING for an expected error,
    ERROR with the traceback for anything else; DEBUG (without it) when ``quiet``."""
    ok = expected(e)
    log.log(
        logging.DEBUG if quiet else logging.WARNING if ok else logging.ERROR,
        "%s failed (%d in a row): %s: %s; tried again in %.1f s",
        what, failed, type(e).__name__, e, pause_s,
        exc_info=not ok and not quiet,
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
    """The failures in a row of one loop, the pause after each, and what the log says.

    The n-th failure in a row pauses ``pause_s * 2 ** (n - 1)``, at most ``expected_max_s``
    (default: ``pause_s``, a steady pace) for an expected error and at most
    :data:`BACKOFF_MAX_S` (or ``expected_max_s`` when longer) for any other. It is logged
    at WARNING (ERROR) when it is the first in a row, of another kind than the last one so
    logged, or ``warn_every_s`` after it (read on ``clock``); else at DEBUG. The loop calls
    :meth:`reset` when its step succeeds: one INFO line after failures.
    """

    def __init__(
        self,
        what: str,
        pause_s: float,
        expected_max_s: float | None = None,
        *,
        warn_every_s: float = WARN_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.pause_s = pause_s
        self.expected_max_s = pause_s if expected_max_s is None else expected_max_s
        self.warn_every_s = warn_every_s
        self._clock = clock
        self.failed = 0
        """Failures in a row (0 after a success)."""
        self._said: tuple[float, tuple[str, object]] | None = None
        """When the last failure logged at WARNING (ERROR) was, and its kind."""

    def reset(self) -> None:
        """The loop's step succeeded: said at INFO after failures; the next failure pauses
        ``pause_s`` again and is logged at WARNING (ERROR)."""
        if self.failed:
            log.info("%s went through after %d failures in a row", self.what, self.failed)
        self.failed = 0
        self._said = None

    def pause_after(self, e: Exception) -> float:
        """Count and log the failure ``e``; return how long to pause before trying again."""
        self.failed += 1
        cap = self.expected_max_s if expected(e) else max(BACKOFF_MAX_S, self.expected_max_s)
        pause: float = min(self.pause_s * 2.0 ** min(self.failed - 1, 30), cap)
        now, kind = self._clock(), (type(e).__qualname__, getattr(e, "name", None))
        quiet = (
            self._said is not None
            and self._said[1] == kind
            and now - self._said[0] < self.warn_every_s
        )
        if not quiet:
            self._said = (now, kind)
        log_failure(self.what, e, self.failed, pause, quiet=quiet)
        return pause

    async def after(self, e: Exception) -> None:
        """Count and log the failure ``e``, then pause."""
        await asyncio.sleep(self.pause_after(e))  # the cause is away or broken: a pace
