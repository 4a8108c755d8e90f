"""The turns of a producer's sends (segtxn/broker/ordering.py), on their own: a send
queues only after every earlier one has queued or given up, whatever order they end in."""

from __future__ import annotations

import asyncio

from segtxn.broker.ordering import SendOrder, Turn


async def test_turns_pass_on_in_the_order_taken() -> None:
    order = SendOrder()
    turns = [order.take() for _ in range(3)]
    went: list[int] = []
    started = [asyncio.Event() for _ in turns]

    async def send(n: int, turn: Turn) -> None:
        started[n].set()
        await turn.wait()
        went.append(n)
        turn.release()

    tasks = [asyncio.create_task(send(n, t)) for n, t in reversed(list(enumerate(turns)))]
    await asyncio.gather(*tasks)
    assert went == [0, 1, 2] and order.idle


async def test_a_send_that_gives_up_early_lets_no_later_one_overtake_an_earlier_one() -> None:
    order = SendOrder()
    first, second, third = order.take(), order.take(), order.take()
    went: list[str] = []
    waiting = asyncio.Event()

    async def later() -> None:
        waiting.set()
        await third.wait()  # returns at once if the refusal let it through
        went.append("third")

    task = asyncio.create_task(later())
    second.release()  # refused before its turn (a duplicate, a closed transaction)
    await waiting.wait()
    assert not order.idle
    went.append("first")
    first.release()
    await task
    assert went == ["first", "third"]


async def test_a_cancelled_waiter_gives_its_turn_up_and_leaves_the_earlier_one_alone() -> None:
    order = SendOrder()
    first, second, third = order.take(), order.take(), order.take()
    went: list[str] = []
    second_waits, third_waits = asyncio.Event(), asyncio.Event()

    async def give_up() -> None:
        try:
            second_waits.set()
            await second.wait()
        finally:
            second.release()

    async def later() -> None:
        third_waits.set()
        await third.wait()
        went.append("third")

    cancelled = asyncio.create_task(give_up())
    await second_waits.wait()
    cancelled.cancel()  # must not cancel (and so pass on) the first turn
    await asyncio.gather(cancelled, return_exceptions=True)
    task = asyncio.create_task(later())
    await third_waits.wait()
    went.append("first")
    first.release()
    await task
    third.release()
    assert went == ["first", "third"] and order.idle
