"""A server's stop (segtxn.stopping): every step runs whatever the ones before it raised,
within a time limit that runs from the start (a coordinator's stop) or, for a broker's, only
from the first step the store failed. A broker's topics closing under load, slower than the
limit with the store answering, must not be cut short: their ledgers and cursors would be
left without their clean state."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from segtxn.ledger import LedgerError, LedgerFenced
from segtxn.metastore import BadVersion, StoreUnavailable
from segtxn.stopping import CANCELLED_END_S, Stopping

LIMIT_S = 0.2


async def _slow(done: list[str], name: str) -> None:
    """A step that succeeds after three times the stop's limit (the time passing is what
    is tested)."""
    await asyncio.sleep(3 * LIMIT_S)  # sleep-ok: the time passing is what is tested
    done.append(name)


async def _fail(error: Exception) -> None:
    raise error


async def test_a_stop_bounded_once_failing_lets_slow_successful_steps_finish(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: list[str] = []
    stopping = Stopping("broker", LIMIT_S, once_failing=True)
    with caplog.at_level(logging.WARNING):
        await stopping.step("closing a topic", _slow(done, "first"))
        await stopping.step("closing another topic", _slow(done, "second"))
    assert done == ["first", "second"]
    assert not caplog.records


async def test_a_store_failure_starts_the_limit_for_the_steps_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: list[str] = []
    stopping = Stopping("broker", LIMIT_S, once_failing=True)
    with caplog.at_level(logging.WARNING):
        await stopping.step("closing a topic", _fail(StoreUnavailable("injected: away")))
        await stopping.step("closing another topic", _slow(done, "cut"))
        await stopping.step("closing the store", _slow(done, "also cut"))
    assert done == []
    messages = [r.getMessage() for r in caplog.records]
    assert "failed: StoreUnavailable: injected: away" in messages[0]
    assert all("not done within the stop's time" in m for m in messages[1:]), messages
    assert len(messages) == 3


async def test_a_ledger_error_caused_by_the_store_starts_the_limit_too() -> None:
    done: list[str] = []
    stopping = Stopping("broker", LIMIT_S, once_failing=True)

    async def close_ledger() -> None:
        try:
            raise StoreUnavailable("injected: away")
        except StoreUnavailable as e:
            raise LedgerError("the ledger's close could not write its record") from e

    await stopping.step("closing a topic", close_ledger())
    await stopping.step("closing another topic", _slow(done, "cut"))
    assert done == []


async def test_a_failure_not_of_the_store_does_not_cut_the_steps_after_it() -> None:
    done: list[str] = []
    stopping = Stopping("broker", LIMIT_S, once_failing=True)
    await stopping.step("closing a topic", _fail(LedgerError("a file went missing")))
    await stopping.step("closing another topic", _slow(done, "finished"))
    assert done == ["finished"]


async def test_a_stop_bounded_from_the_start_cuts_a_slow_step() -> None:
    done: list[str] = []
    stopping = Stopping("coordinator", LIMIT_S)
    await stopping.step("resigning its ids", _slow(done, "cut"))
    assert done == []


async def test_a_topic_fenced_by_another_owner_does_not_cut_the_steps_after_it() -> None:
    """A fenced ledger's close raises a ledger error from the store's BadVersion: the store
    answered (another broker took the topic over), so the other topics still get their time
    to close cleanly."""
    done: list[str] = []
    stopping = Stopping("broker", LIMIT_S, once_failing=True)

    async def close_fenced() -> None:
        try:
            raise BadVersion("/ledgers/t", 7, 9)
        except BadVersion as e:
            raise LedgerFenced("persistent://t/n/x: changed by another owner") from e

    await stopping.step("closing a topic taken over", close_fenced())
    await stopping.step("closing another topic", _slow(done, "finished"))
    assert done == ["finished"]


async def test_cancelled_tasks_are_waited_for_a_bounded_time_and_those_left_are_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A coordinator's stop cancels its background tasks; one that takes its cancel and
    goes on held the stop (outside its time limit) for as long as it ran."""
    ended, release = asyncio.Event(), asyncio.Event()

    async def ends() -> None:
        await asyncio.Event().wait()

    async def fails_at_its_cancel() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise ValueError("a failure at its end: retrieved, not raised")

    async def goes_on() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # (taken: a clean-up that waits for a silent store)
        ended.set()

    tasks = [
        asyncio.create_task(ends(), name="ends"),
        asyncio.create_task(fails_at_its_cancel(), name="fails"),
        asyncio.create_task(goes_on(), name="goes-on"),
    ]
    await asyncio.sleep(0)  # sleep-ok: one loop step: the tasks are started
    stopping = Stopping("coordinator", LIMIT_S)
    try:
        with caplog.at_level(logging.WARNING):
            async with asyncio.timeout(CANCELLED_END_S + 5.0):
                await stopping.cancel("its tasks", tasks)
        assert tasks[0].cancelled() and tasks[1].done() and not tasks[2].done()
        (left,) = caplog.records
        assert left.levelname == "WARNING" and "(goes-on)" in left.getMessage()
    finally:
        release.set()
        await ended.wait()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_failures_of_tasks_left_by_a_cancelled_stop_are_retrieved() -> None:
    """A stop cancelled while it waits for its cancelled tasks (the CLI's
    ``--shutdown-timeout``) still retrieves their failures: asyncio logged each as 'Task
    exception was never retrieved' once the task was collected."""
    loop = asyncio.get_running_loop()
    unretrieved: list[str] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context["message"]))
    waiting, release = asyncio.Event(), asyncio.Event()

    async def fails_late() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            waiting.set()
            await release.wait()  # (taken: a clean-up that waits for a silent store)
            raise ValueError("a failure at its end, after the stop was cancelled") from None

    task = asyncio.create_task(fails_late(), name="fails-late")
    try:
        await asyncio.sleep(0)  # sleep-ok: one loop step: the task is started
        stop = asyncio.create_task(Stopping("broker", LIMIT_S).cancel("its tasks", [task]))
        await waiting.wait()
        stop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stop
        release.set()
        async with asyncio.timeout(5):
            await asyncio.wait([task])
        del task
        gc.collect()
    finally:
        loop.set_exception_handler(handler)
    assert not unretrieved
