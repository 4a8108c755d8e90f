"""Small asyncio helpers shared by every layer.

Done callbacks an object adds to its own futures (one or more per message in the client)
run in :func:`callbacks_context` rather than in a copy of the caller's context.

Racing two waits (an event stream against a session's expiry, say) is easy to get wrong:
a losing ``anext()`` future left behind keeps a generator half-driven and leaks a task.
:func:`first_completed` runs each coroutine as an owned, named task, and before it returns
it cancels the losers *and waits for them to finish*.

:func:`settling` hands a task's outcome to a future its waiter awaits: one loop turn
sooner than awaiting the task through a shield, with the same cancel and error cases.

:func:`run_to_end` runs a step that must not be left half-way by its caller's cancel
(within a bounded grace, one for all the steps run while that cancel unwinds, and, through
:func:`cancel`, for those of the tasks it passes the cancel on to).

:class:`Window` counts the slots of a send window, as ``asyncio.Semaphore`` would, at the
cost of an integer comparison where there is room.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def callbacks_context() -> contextvars.Context:
    """An empty context for the done callbacks one object adds to its own futures
    (``future.add_done_callback(cb, context=...)``).

    Without ``context=`` asyncio copies the caller's context for every callback: one more
    object per callback for the garbage collector to track. A client's hot path adds
    several per message, so the copies were a tenth of what a consume-transform-produce
    loop allocated. A callback run here must read no context variable (none of ours do:
    they settle futures and release counters), and a task it starts starts from this
    context too (the scalable producer's re-router, started when a segment refuses a send:
    its re-sends are traced as spans of their own, not as children of whichever send was
    refused first). Keep one per object, used on its own event loop: callbacks run one at
    a time there, so the context is never entered twice at once (which ``Context.run``
    refuses)."""
    return contextvars.Context()


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


async def settling(done: asyncio.Future[T], work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` (as the body of a task of its own) and settle ``done`` as it ends; the
    task ends as ``work`` did.

    Why: a waiter that awaits ``done`` resumes in the loop turn after ``work`` ends, where
    one awaiting the task through ``asyncio.shield`` (so that its own cancel does not
    cancel the work) resumes two turns after: the task's end, then the shield's. On a busy
    broker a turn costs a few hundred microseconds, on the path from a one-step commit's
    store step to the sends' receipts its client's ``commit()`` waits for (issue 16).

    A waiter cancelled meanwhile cancels ``done`` (and not the work): it then waits for the
    task itself. An error handed to ``done`` is marked retrieved on the task too (its
    waiter raises it), so nothing logs it as never retrieved. A cancelled ``work`` cancels
    ``done``.
    """
    try:
        outcome = await work
    except asyncio.CancelledError:
        done.cancel()
        raise
    except Exception as e:
        if not done.done():
            done.set_exception(e)
            done.exception()  # retrieved here: its waiter raises it
            task = asyncio.current_task()
            if task is not None:
                task.add_done_callback(_retrieve)
        raise
    if not done.done():
        done.set_result(outcome)
    return outcome


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


CANCEL_GRACE_S = 1.0
"""How long a cancel waits for a :func:`run_to_end` step to end: a store that answers at all
answers a CAS well within it, even on a loaded machine; one that does not cannot hold a
stop or a close past its own time limit by more than this."""


_GRACE_ENDS = "_segtxn_grace_ends"
"""The attribute a cancel (its ``CancelledError``) carries once a :func:`run_to_end` step
began its grace: when the grace ends (loop time)."""


async def run_to_end(
    work: Coroutine[Any, Any, T], *, name: str, grace_s: float = CANCEL_GRACE_S
) -> T:
    """Run ``work`` as a task of its own and return what it returns. A cancel of the caller
    meanwhile lets ``work`` end first, for up to ``grace_s``, and is raised then (``work``'s
    own failure, if it had one, is dropped: the caller was cancelled); a ``work`` still
    running then is cancelled, as it would have been without this. A repeated cancel within
    the grace changes nothing.

    One cancel, one grace: a step run while the caller unwinds from a cancel its task took
    (in an ``except`` or ``finally``: a close that closes its ledger whatever stopped it)
    gets what is left of that cancel's grace (all of it, from now, if no step had begun it)
    and is cancelled past it, raising ``CancelledError``. Left to itself, it had no grace
    at all, no cancel coming to start one: it waited for the store's answer, and a store
    that did not answer held the stop's step for ever; and steps run one after another
    under one cancel would each add a grace.

    Why: some steps change an outside record and then what the process holds in memory
    about it, and their outcome must be known to what runs them: a ledger's metadata
    compare-and-set, which the store may have applied by the time a cancel arrives. Left at
    the cancel, the ledger took its rollover for failed while the store held it, and its
    next change was refused as another owner's (``LedgerFenced``): a log's close cancelling
    its compaction lost its clean close. Why the grace is bounded: a stop's steps and the
    CLI's ``--shutdown-timeout`` cancel what runs past their time, and a store that never
    answers must not hold them for ever. Past the grace the step is left in doubt, as for
    a store whose answer was lost: the ledger's next change finds out what landed.
    """
    loop = asyncio.get_running_loop()
    unwinding = _unwinding()
    deadline = None if unwinding is None else _grace_ends(unwinding, loop.time() + grace_s)
    task = asyncio.create_task(work, name=name)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        timeout = None if deadline is None else max(0.0, deadline - loop.time())
        if timeout == 0.0:
            task.cancel()  # past the grace: in doubt, as a lost answer
            await asyncio.wait([task])  # (it ends at its next await)
            break
        try:
            await asyncio.wait([task], timeout=timeout)  # (a cancel of the wait: not the task)
        except asyncio.CancelledError as e:
            cancelled = cancelled or e
            deadline = _grace_ends(e, loop.time() + grace_s if deadline is None else deadline)
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the caller raises its cancel instead
        raise cancelled
    if deadline is not None and task.cancelled():  # unwinding past its grace: the cancel
        raise _grace_ends_with(asyncio.CancelledError(), deadline)  # goes on, with its grace
    return task.result()


def _unwinding() -> asyncio.CancelledError | None:
    """The cancel the caller is unwinding from (handled in an ``except`` or ``finally`` of
    its own or of a caller's), if its task took one; None otherwise."""
    task = asyncio.current_task()
    handled = sys.exc_info()[1]
    if task is not None and task.cancelling() and isinstance(handled, asyncio.CancelledError):
        return handled
    return None


def cancel(task: asyncio.Future[Any], *, grace_s: float = CANCEL_GRACE_S) -> None:
    """Cancel ``task`` as part of the cancel the caller unwinds from, if it is unwinding
    from one (in an ``except`` or ``finally``): the :func:`run_to_end` steps of ``task``
    then share that cancel's grace (what is left of it; begun now if no step had begun it).
    Otherwise a plain ``task.cancel()``.

    Why: ``task`` took a cancel of its own, a new ``CancelledError``, and its steps began a
    grace of their own. A close run while its caller unwound from a cancel (a topic's close
    cut by one closes its subscriptions in its handler) cancels its compaction, waits for
    it, then writes its clean close: the compaction's rollover got a grace, and the clean
    close then began the caller's, so that with the store silent the close ended two graces
    after the cancel, not one."""
    unwinding = _unwinding()
    if unwinding is None:
        task.cancel()
        return
    ends = _grace_ends(unwinding, asyncio.get_running_loop().time() + grace_s)
    task.cancel(msg=_PassedOn(ends))


SETTLE_S = 5.0
"""How long a close waits for a background write of its own in flight (a snapshot, which a
replay covers if it is lost) before it cancels it (:func:`settle`): a store that answers at
all answers within it."""


async def settle(
    task: asyncio.Task[Any], within_s: float, *, grace_s: float = CANCEL_GRACE_S
) -> bool:
    """Wait for ``task`` (a background write a close must not leave running) for
    ``within_s`` at most; past it, cancel it (:func:`cancel`) and wait for it to end,
    ``grace_s`` and a moment at most (its :func:`run_to_end` steps end within the grace).
    Whether it ended by itself. Its failure is neither raised nor left unretrieved; one
    still running at the end is left to end by itself. A cancel of the caller meanwhile
    cancels ``task`` too (sharing that cancel's grace), waits likewise, and is raised.

    Called while the caller unwinds from a cancel (in an ``except`` or ``finally``: a
    topic's close cut by a stop's time limit closes its parts in its handler), it waits
    what is left of that cancel's grace at most, ``within_s`` or less, as a
    :func:`run_to_end` step would: one cancel, one grace. It waited ``within_s`` there, and
    the cut close ended :data:`SETTLE_S` (per snapshot in flight) after the cancel.

    Why: a close awaited its snapshot in flight without a bound, and a store that never
    answered the snapshot's write (or a write whose answer was lost, on the in-memory
    store) held the close, and a broker's stop, for ever."""
    loop = asyncio.get_running_loop()
    unwinding = _unwinding()
    if unwinding is not None:
        within_s = min(within_s, _grace_ends(unwinding, loop.time() + grace_s) - loop.time())
    try:
        await asyncio.wait([task], timeout=max(0.0, within_s))
    except asyncio.CancelledError:
        cancel(task, grace_s=grace_s)
        await _ended(task, grace_s)
        raise
    if task.done():
        _retrieve(task)
        return True
    cancel(task, grace_s=grace_s)
    await _ended(task, grace_s)
    return False


async def _ended(task: asyncio.Task[Any], grace_s: float) -> None:
    """Wait for a cancelled ``task`` its grace (what is left of it, when the caller
    unwinds from a cancel: the grace :func:`cancel` passed on to ``task``) and a moment
    (to end at its next await) at most; its failure is retrieved whenever it ends."""
    task.add_done_callback(_retrieve)
    loop = asyncio.get_running_loop()
    unwinding = _unwinding()
    if unwinding is not None:
        grace_s = max(0.0, _grace_ends(unwinding, loop.time() + grace_s) - loop.time())
    await asyncio.wait([task], timeout=grace_s + CANCELLED_MOMENT_S)


CANCELLED_MOMENT_S = 0.1
"""What a task cancelled past its grace may take to end after it (at its next await)."""


class _PassedOn:
    """The message of a cancel passed on by :func:`cancel`: when its grace ends."""

    def __init__(self, grace_ends: float) -> None:
        self.grace_ends = grace_ends

    def __str__(self) -> str:
        return "cancelled with its canceller (sharing its grace)"


def _grace_ends(cancel: asyncio.CancelledError, otherwise: float) -> float:
    """When ``cancel``'s grace ends: the one passed on with it (:func:`cancel`), or
    ``otherwise`` if none began yet (it begins then)."""
    ends = getattr(cancel, _GRACE_ENDS, None)
    if ends is None:
        passed = cancel.args[0] if cancel.args else None
        ends = passed.grace_ends if isinstance(passed, _PassedOn) else otherwise
        _grace_ends_with(cancel, ends)
    return float(ends)


def _grace_ends_with(cancel: asyncio.CancelledError, ends: float) -> asyncio.CancelledError:
    setattr(cancel, _GRACE_ENDS, ends)
    return cancel


class Window:
    """``size`` slots, taken with :meth:`acquire` and given back with :meth:`release`:
    ``asyncio.Semaphore``'s contract (first come, first served; a waiter cancelled while it
    waits takes no slot), with :attr:`full` in place of ``locked()``.

    Why not the semaphore: in Python 3.11 its ``locked()`` builds a generator over the
    waiters on every call, and ``acquire()`` calls it too. A producer's window is asked
    once or twice per message, on both sides: py-spy put ``locked()`` at 14 % of the
    client's main thread and 5 % of the broker's at full rate (bench/broker.py, 1
    producer). Here a free slot costs one comparison.

    A released slot goes straight to the first waiter (so :attr:`full` stays true while
    anyone waits, and a new caller never overtakes a waiter).
    """

    __slots__ = ("_free", "_waiters")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a window needs at least one slot, not {size}")
        self._free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def full(self) -> bool:
        """No slot is free: :meth:`acquire` would wait."""
        return self._free == 0

    def try_acquire(self) -> bool:
        """Take a slot if one is free (True), without waiting: :meth:`acquire`'s fast path
        without a coroutine, for a caller that asks once per message."""
        if self._free:  # (never free while someone waits: release hands slots over)
            self._free -= 1
            return True
        return False

    async def acquire(self) -> None:
        """Take a slot, waiting for one if none is free."""
        if self.try_acquire():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if not waiter.cancelled():
                self.release()  # handed a slot as it was cancelled: it goes on
            elif waiter in self._waiters:  # (a release may have dropped it already)
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a slot back: to the first waiter, else to the free ones."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
