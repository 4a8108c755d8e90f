"""A server's stop: every clean-up step runs, whatever the ones before it raised, and the
stop ends in a bounded time. Shared by the coordinator and the broker (neither may import
the other).

A coordinator's stop resigns its ids (so that another coordinator takes them at once),
closes its v4 logs, its store sessions, its HTTP sessions and, when it opened it, the
store; a broker's closes its topics, its snapshot logs, its storage nodes, its session and,
when it opened it, the store. With the store down, a step fails or does not answer: it
raised out of ``stop()`` and every later step was skipped (ids not resigned; sessions, HTTP
sessions and the store left open, their tasks running, with a traceback), or it held the
stop for as long as the store kept silent. Each step is now a :meth:`Stopping.step`: a
failure is logged once at WARNING and the next step runs, and the steps of one stop share
one time limit: a coordinator's from the start of its stop, a broker's from the first step
the store failed (:class:`Stopping`). The background tasks a stop cancels get
:data:`~segtxn.aio.CANCEL_GRACE_S` to end (:meth:`Stopping.cancel`), not for ever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from typing import Any

from segtxn.aio import CANCEL_GRACE_S, CANCELLED_MOMENT_S, cancel
from segtxn.ledger import LedgerError
from segtxn.metastore import (
    MetadataStoreError,
    StoreAccessDenied,
    StoreClosed,
    StoreFull,
    StoreUnavailable,
)
from segtxn.protocol.errors import ServerError

__all__ = ["CANCELLED_END_S", "EXPECTED", "LAST_STEP_S", "STOP_LIMIT_S", "Stopping", "expected"]

log = logging.getLogger(__name__)

EXPECTED = (MetadataStoreError, ServerError, LedgerError)
"""The errors a server meets in normal operation: the store, a peer or a ledger away (logged
without a traceback; anything else is a bug)."""


NOT_SERVING = (StoreUnavailable, StoreFull, StoreAccessDenied, StoreClosed)
"""The store errors that start a ``once_failing`` stop's time limit."""


def expected(e: BaseException) -> bool:
    return isinstance(e, EXPECTED)


STOP_LIMIT_S = 10.0
"""How long the steps of one server's stop may take together: a store that does not
answer holds it this long (plus :data:`LAST_STEP_S` a step after), well within the CLI's
``--shutdown-timeout`` (20 s by default), which also stops the broker of a standalone."""

LAST_STEP_S = 0.5
"""What a step begun once the stop's time is up still gets: one that needs no store
(closing an HTTP session, cancelling tasks) still runs; one that waits on the store is
abandoned soon."""


CANCELLED_END_S = CANCEL_GRACE_S + CANCELLED_MOMENT_S
"""How long a stop waits for the tasks it cancelled: the grace a ledger change in flight
gets (:func:`~segtxn.aio.run_to_end`), and a moment for one cancelled past it to end (at
its next await): waited for :data:`~segtxn.aio.CANCEL_GRACE_S` exactly, such a task was
named as left behind a few milliseconds before it ended."""


class Stopping:
    """The steps of one stop, which share a time limit of ``limit_s`` (default:
    :data:`STOP_LIMIT_S`).

    The limit runs from now, or, with ``once_failing``, from the first step that fails
    for the store (it did not serve the step: :data:`NOT_SERVING`, or one behind the error):
    a stop whose steps all succeed then takes as long as they need (a broker's topics
    closing under load, whose ledgers and cursors a cut would leave without their clean
    state: the CLI's ``--shutdown-timeout`` still bounds the whole), while one whose store
    stopped answering ends soon after it shows (each store call fails within its request
    timeout).

    No limit of its own for a store that is silent without failing: etcd's calls fail
    within their request timeout, and the in-memory store answers every call within a loop
    turn, in the process (silent only under the fault injector's ``hold``, in tests). What
    is not the store may still hold a close (a disk that hangs): the CLI's
    ``--shutdown-timeout``, or an embedding caller's own timeout, bounds the whole stop. The
    waits a close makes for its own background work are bounded where they are made
    (:func:`~segtxn.aio.settle`, :meth:`cancel`)."""

    def __init__(
        self, what: str, limit_s: float | None = None, *, once_failing: bool = False
    ) -> None:
        self.what = what
        self._loop = asyncio.get_running_loop()
        self._limit_s = STOP_LIMIT_S if limit_s is None else limit_s
        self._deadline: float | None = None if once_failing else self._loop.time() + self._limit_s

    async def step(self, what: str, action: Awaitable[object]) -> None:
        """Await ``action``, one step of the stop, within what is left of its time (at
        least :data:`LAST_STEP_S`; no limit while a ``once_failing`` stop has not failed).
        Neither its failure nor its running out of time is raised: it is logged at WARNING
        (with the traceback when it is not an error the store, the ledger or a server
        gives: a bug), and the stop goes on. Cancellation (the stop itself cancelled) is
        raised."""
        deadline = None
        if self._deadline is not None:
            deadline = max(self._deadline, self._loop.time() + LAST_STEP_S)
        try:
            async with asyncio.timeout_at(deadline):
                await action
        except TimeoutError:
            log.warning(
                "%s: %s not done within the stop's time; going on without it", self.what, what
            )
        except Exception as e:
            log.warning(
                "%s: %s failed: %s: %s; going on", self.what, what, type(e).__name__, e,
                exc_info=not expected(e),
            )  # fmt: skip
            if self._deadline is None and _for_the_store(e):
                self._deadline = self._loop.time() + self._limit_s

    async def cancel(self, what: str, tasks: Iterable[asyncio.Task[Any]]) -> None:
        """Cancel ``tasks`` (``what``: the server's background work) and wait for them to
        end, for :data:`CANCELLED_END_S` at most: those still running then are
        left to end by themselves (said once at WARNING, naming them), and the stop goes
        on. Their failures are not raised (nor left unretrieved, even when the stop is
        cancelled during the wait: asyncio then logged each one as 'Task exception was
        never retrieved'). Cancellation (the stop itself cancelled) is raised.

        Why the bound: a cancelled task may take the grace to end (a ledger's metadata
        change in flight ends first, and so do those its clean-up makes:
        :func:`~segtxn.aio.run_to_end`), and one that takes its cancel and goes on ends
        when it ends. Awaited without a bound, before and outside the stop's time limit,
        such a task held the stop as long: a v4 take-over cancelled while it opened its
        log closes that log, and its clean-close write waited for a silent store for
        ever."""
        tasks = list(tasks)
        for task in tasks:
            cancel(task)  # (sharing the grace of a cancel the stop unwinds from, if any)
            task.add_done_callback(_retrieve)  # (before the wait, which may itself be cut)
        if not tasks:
            return
        _, left = await asyncio.wait(tasks, timeout=CANCELLED_END_S)
        if left:
            log.warning(
                "%s: %s still running %.1f s after their cancel (%s); going on without them",
                self.what, what, CANCELLED_END_S, ", ".join(sorted(t.get_name() for t in left)),
            )  # fmt: skip

    async def steps(self, *steps: tuple[str, Awaitable[object]]) -> None:
        """Several steps at once (resigning each id: one store round trip for them all,
        not one after another)."""
        await asyncio.gather(*(self.step(what, action) for what, action in steps))


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _for_the_store(e: BaseException) -> bool:
    """Whether ``e`` is, or was raised because of, the store not serving (away, full,
    refusing, closed): a ledger's close that could not write its record raises a ledger
    error from one. Not an answer it gave (``BadVersion``, ``NotFound``: a topic another
    broker took over is fenced), which says nothing of the other steps' chances."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, NOT_SERVING):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False
