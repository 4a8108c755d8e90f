"""segtxn.aio.Window: a send window's slots, as asyncio.Semaphore counts them (first come,
first served; a cancelled waiter takes no slot and loses none)."""

from __future__ import annotations

import asyncio

import pytest

from segtxn.aio import Window
from tests.waiting import wait_until


async def test_slots_are_taken_at_once_while_free_and_full_says_when_none_is() -> None:
    window = Window(2)
    assert not window.full
    await window.acquire()
    await window.acquire()
    assert window.full
    window.release()
    assert not window.full


async def test_waiters_get_released_slots_first_come_first_served() -> None:
    window = Window(1)
    await window.acquire()
    order: list[int] = []

    async def take(i: int) -> None:
        await window.acquire()
        order.append(i)

    waiters = [asyncio.create_task(take(i)) for i in range(3)]
    await wait_until(lambda: len(window._waiters) == 3, what="the three waiting")
    for resumed in range(1, 4):
        window.release()
        await wait_until(lambda: len(order) == resumed, what="the next waiter resumed")  # noqa: B023
        assert window.full  # the slot went to a waiter: a newcomer would wait
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2]
    window.release()
    assert not window.full


async def test_a_newcomer_does_not_overtake_a_waiter_after_a_release() -> None:
    window = Window(1)
    await window.acquire()
    waiter = asyncio.create_task(window.acquire())
    await wait_until(lambda: len(window._waiters) == 1, what="waiting")
    window.release()  # handed to the waiter, which has not run yet
    newcomer = asyncio.create_task(window.acquire())
    await waiter
    await wait_until(lambda: len(window._waiters) == 1, what="the newcomer waiting")
    assert not newcomer.done()
    window.release()
    await newcomer


async def test_a_waiter_cancelled_while_it_waits_takes_no_slot() -> None:
    window = Window(1)
    await window.acquire()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await window.acquire()
    assert not window._waiters
    window.release()
    assert not window.full  # the slot came back to the free ones, not to the gone waiter
    await window.acquire()


async def test_a_waiter_cancelled_after_it_was_handed_a_slot_passes_it_on() -> None:
    window = Window(1)
    await window.acquire()
    first = asyncio.create_task(window.acquire())
    second = asyncio.create_task(window.acquire())
    await wait_until(lambda: len(window._waiters) == 2, what="both waiting")
    window.release()  # handed to first...
    first.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 5)  # the slot went on to the second
    assert window.full
    window.release()
    assert not window.full  # and no slot was made or lost


def test_a_window_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        Window(0)


async def test_try_acquire_takes_a_free_slot_and_never_one_a_waiter_was_handed() -> None:
    window = Window(1)
    assert window.try_acquire()
    assert not window.try_acquire()  # none free: it does not wait, it says so
    waiter = asyncio.create_task(window.acquire())
    await wait_until(lambda: len(window._waiters) == 1, what="waiting")
    window.release()  # handed to the waiter, which has not run yet
    assert not window.try_acquire()  # no overtaking, as for acquire()
    await waiter
    window.release()
    assert window.try_acquire()
