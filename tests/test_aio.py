"""``segtxn.aio.settling``: a task's outcome handed to a future its waiter awaits, one loop
turn after the work ends (a shield over the task costs two), and the cancel and error
cases a waiter and the task must each see as before (issue 16: those turns sat between a
one-step commit's store step and the sends' receipts its client waits for).

``segtxn.aio.run_to_end``: a step its caller's cancel must not leave half-way (a ledger's
metadata CAS) ends first; the cancel is raised then."""

from __future__ import annotations

import asyncio
import gc

import pytest

from segtxn.aio import cancel, run_to_end, settle, settling


class Turns:
    """Counts event-loop turns: a callback that schedules itself again each time it runs
    (a loop turn runs the callbacks ready when it began, so this one once per turn)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.count = 0
        self._handle = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.count += 1
        self._handle = self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._handle.cancel()


async def test_the_waiter_resumes_in_the_loop_turn_after_the_work_ends() -> None:
    loop = asyncio.get_running_loop()
    release = asyncio.Event()
    turns = Turns()
    ended_at: list[int] = []

    async def work() -> int:
        await release.wait()
        ended_at.append(turns.count)
        return 7

    done: asyncio.Future[int] = loop.create_future()
    task = loop.create_task(settling(done, work()))
    release.set()
    try:
        assert await done == 7
        # awaiting the task through asyncio.shield resumes 2 turns after (the task's end,
        # then the shield's)
        assert turns.count - ended_at[0] == 1
    finally:
        turns.stop()
    assert await task == 7


async def test_a_waiter_cancelled_meanwhile_leaves_the_work_running_to_the_tasks_end() -> None:
    loop = asyncio.get_running_loop()
    release, started = asyncio.Event(), asyncio.Event()

    async def work() -> int:
        started.set()
        await release.wait()
        return 7

    done: asyncio.Future[int] = loop.create_future()
    task = loop.create_task(settling(done, work()))

    async def waiter() -> int:
        return await done

    waiting = loop.create_task(waiter())
    await started.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert done.cancelled() and not task.done()
    release.set()
    assert await asyncio.shield(task) == 7


async def test_an_error_of_the_work_goes_to_the_waiter_and_is_retrieved_from_the_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()

    async def work() -> int:
        raise ValueError("broken")

    async def scenario() -> None:  # (its frame, holding them all, is gone after)
        done: asyncio.Future[int] = loop.create_future()
        task = loop.create_task(settling(done, work()))
        with pytest.raises(ValueError, match="broken"):
            await done
        await asyncio.wait([task])

    await scenario()
    gc.collect()  # a task whose exception nobody retrieved is logged when collected
    assert "never retrieved" not in caplog.text


async def test_an_error_after_the_waiter_gave_up_ends_the_task() -> None:
    loop = asyncio.get_running_loop()
    release = asyncio.Event()

    async def work() -> int:
        await release.wait()
        raise ValueError("broken")

    done: asyncio.Future[int] = loop.create_future()
    task = loop.create_task(settling(done, work()))
    done.cancel()  # (what a waiter's cancel does to it)
    release.set()
    with pytest.raises(ValueError, match="broken"):
        await asyncio.shield(task)


async def test_a_cancelled_work_cancels_the_waiters_future() -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    async def work() -> int:
        started.set()
        await asyncio.Event().wait()
        return 7

    done: asyncio.Future[int] = loop.create_future()
    task = loop.create_task(settling(done, work()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await done
    await asyncio.wait([task])
    assert task.cancelled()


# ---------------------------------------------------------------------- run_to_end


async def test_run_to_end_lets_a_cancel_wait_for_the_work_and_raises_it_then() -> None:
    """A ledger's metadata CAS cancelled mid-flight was left to land unseen (the ledger
    took its own rollover for another owner's): the work now ends first, and its effect
    is there when the caller's cancel is raised, however many cancels came."""
    release = asyncio.Event()
    done: list[str] = []

    async def work() -> str:
        await release.wait()
        done.append("landed")
        return "landed"

    caller = asyncio.create_task(run_to_end(work(), name="work"))
    await asyncio.sleep(0)  # sleep-ok: one loop step: the work is started
    caller.cancel()
    await asyncio.sleep(0)  # sleep-ok: one loop step: the caller got its cancel
    caller.cancel()
    assert not caller.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert done == ["landed"]


async def test_run_to_end_under_a_timeout_raises_timeout_error_after_the_work() -> None:
    release = asyncio.Event()

    async def work() -> None:
        await release.wait()
        raise ValueError("the work's own failure: dropped, the caller was cancelled")

    async def caller() -> None:
        async with asyncio.timeout(0):
            await run_to_end(work(), name="work")

    calling = asyncio.create_task(caller())
    await asyncio.sleep(0)  # sleep-ok: one loop step: its deadline passes
    await asyncio.sleep(0)  # sleep-ok: and its cancel arrives
    assert not calling.done()
    release.set()
    with pytest.raises(TimeoutError):
        await calling


async def test_run_to_end_returns_or_raises_what_the_work_did() -> None:
    async def answer() -> int:
        return 7

    async def fail() -> None:
        raise ValueError("no")

    assert await run_to_end(answer(), name="answer") == 7
    with pytest.raises(ValueError, match="no"):
        await run_to_end(fail(), name="fail")


async def test_run_to_end_abandons_a_work_that_outlasts_the_grace_and_raises_the_cancel() -> None:
    """A store that never answers must not hold a stop's step, nor the CLI's shutdown, for
    ever: past the grace the work is cancelled (left in doubt, as a lost answer)."""
    never = asyncio.Event()
    ended: list[str] = []

    async def work() -> None:
        try:
            await never.wait()
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    caller = asyncio.create_task(run_to_end(work(), name="work", grace_s=0.05))
    await asyncio.sleep(0)  # sleep-ok: one loop step: the work is started
    caller.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await caller
    assert ended == ["cancelled"]


async def test_run_to_end_while_a_cancel_unwinds_ends_within_that_cancels_grace() -> None:
    """A close that closes its ledger whatever stopped it (in a ``finally``) runs the
    ledger's clean-close CAS after its cancel was taken: no cancel came to start a grace,
    and a store that never answered held it (a stop's step, the CLI's shutdown) for ever."""
    never = asyncio.Event()
    ended: list[str] = []

    async def work() -> None:
        try:
            await never.wait()
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    async def closing() -> None:
        try:
            await never.wait()  # (the cancel is taken here, not in a run_to_end)
        finally:
            await run_to_end(work(), name="clean-close", grace_s=0.05)

    caller = asyncio.create_task(closing())
    await asyncio.sleep(0)  # sleep-ok: one loop step: the caller waits
    caller.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await caller
    assert ended == ["cancelled"]


async def test_run_to_end_steps_in_sequence_under_one_cancel_share_its_grace() -> None:
    """Several changes one after another under one cancel (a topic's close: its
    subscriptions' logs, then its ledger in a ``finally``) are late by one grace in all,
    not one each."""
    grace_s = 0.5
    never = asyncio.Event()
    started: list[int] = []

    async def work(n: int) -> None:
        started.append(n)
        await never.wait()

    async def closing() -> None:
        try:
            try:
                await run_to_end(work(1), name="first", grace_s=grace_s)
            finally:
                await run_to_end(work(2), name="second", grace_s=grace_s)
        finally:
            await run_to_end(work(3), name="third", grace_s=grace_s)

    caller = asyncio.create_task(closing())
    await asyncio.sleep(0)  # sleep-ok: one loop step: the first step runs
    loop = asyncio.get_running_loop()
    cancelled_at = loop.time()
    caller.cancel()
    async with asyncio.timeout(5 * grace_s):
        with pytest.raises(asyncio.CancelledError):
            await caller
    took = loop.time() - cancelled_at
    assert grace_s <= took < 2 * grace_s, f"{took:.2f} s: not one grace for the three steps"
    assert started == [1]  # the others were cancelled before they began: the grace was over


async def test_a_task_cancelled_while_its_canceller_unwinds_shares_that_cancels_grace() -> None:
    """A close run in a ``finally`` cancels its compaction (a step in flight), waits for it,
    then runs a step of its own: cancelled with ``task.cancel()``, the compaction's step
    began a grace of its own, and the close's step then began the caller's: two graces."""
    grace_s = 0.5
    never = asyncio.Event()

    async def compaction() -> None:
        await run_to_end(never.wait(), name="rollover", grace_s=grace_s)

    async def closing(compacting: asyncio.Task[None]) -> None:
        try:
            await never.wait()
        finally:
            cancel(compacting, grace_s=grace_s)
            await asyncio.gather(compacting, return_exceptions=True)
            await run_to_end(never.wait(), name="clean-close", grace_s=grace_s)

    compacting = asyncio.create_task(compaction())
    caller = asyncio.create_task(closing(compacting))
    await asyncio.sleep(0)  # sleep-ok: one loop step: both wait
    loop = asyncio.get_running_loop()
    cancelled_at = loop.time()
    caller.cancel()
    async with asyncio.timeout(5 * grace_s):
        with pytest.raises(asyncio.CancelledError):
            await caller
    took = loop.time() - cancelled_at
    assert grace_s <= took < 1.5 * grace_s, f"{took:.2f} s: not one grace for the cancel"
    assert compacting.cancelled()


async def test_cancel_outside_an_unwinding_is_a_plain_cancel() -> None:
    never = asyncio.Event()
    task = asyncio.create_task(run_to_end(never.wait(), name="step", grace_s=0.05))
    await asyncio.sleep(0)  # sleep-ok: one loop step: the step runs
    cancel(task)
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_settle_waits_its_time_then_cancels_a_write_that_does_not_end() -> None:
    never = asyncio.Event()
    ended: list[str] = []

    async def finishes() -> None:
        await asyncio.sleep(0)  # sleep-ok: one loop step: it ends at once
        raise ValueError("a failure: retrieved, not raised")

    async def silent() -> None:
        try:
            await never.wait()
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    assert await settle(asyncio.create_task(finishes()), 5.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await settle(asyncio.create_task(silent()), 0.1)
    assert ended == ["cancelled"] and loop.time() - started < 1.0


async def test_settle_cancelled_cancels_the_write_with_the_callers_cancel() -> None:
    never = asyncio.Event()
    write = asyncio.create_task(run_to_end(never.wait(), name="snapshot", grace_s=0.2))
    caller = asyncio.create_task(settle(write, 60.0, grace_s=0.2))
    await asyncio.sleep(0)  # sleep-ok: one loop step: the caller waits
    caller.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await caller
    assert write.cancelled()


async def test_settle_while_a_cancel_unwinds_waits_within_that_cancels_grace() -> None:
    """A topic's close cut by a cancel (a stop past its ``--shutdown-timeout``) closes its
    transaction buffer and settles its publishing in the handler, sharing what is left of
    the cancel's grace: a snapshot in flight was waited for its whole ``SETTLE_S`` there, and
    the close ended that long after the cancel, not within its one grace."""
    grace_s = 0.5
    never = asyncio.Event()
    write = asyncio.create_task(run_to_end(never.wait(), name="snapshot", grace_s=grace_s))

    async def closing() -> None:
        try:
            await never.wait()  # (the cancel is taken here: a subscription's close)
        except asyncio.CancelledError:
            await settle(write, 30.0, grace_s=grace_s)
            raise

    caller = asyncio.create_task(closing())
    await asyncio.sleep(0)  # sleep-ok: one loop step: the caller and the write wait
    loop = asyncio.get_running_loop()
    cancelled_at = loop.time()
    caller.cancel()
    async with asyncio.timeout(40):
        with pytest.raises(asyncio.CancelledError):
            await caller
    took = loop.time() - cancelled_at
    assert took < 2 * grace_s, f"{took:.2f} s after the cancel: not within its grace"
    assert write.cancelled()
