"""Where a transaction's operations went (segtxn/client/onestep.py, ``Placements``): the
one broker they all went to, and waiting until each is placed or settled."""

from __future__ import annotations

import asyncio
from typing import Any

from segtxn.client.onestep import Placements
from segtxn.client.timeouts import Deadline


def future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


async def test_one_broker_and_its_distinct_names() -> None:
    placements = Placements()
    assert placements.broker() is None  # nothing placed
    op = future()
    placements.placed(op, "http://b1", "s seg p 0")
    placements.placed(op, "http://b1", "s seg p 0")  # a resend: the same operation
    placements.placed(future(), "http://b1", "a seg sub 1:2")
    assert placements.broker() == "http://b1"
    assert sorted(placements.names("http://b1")) == ["a seg sub 1:2", "s seg p 0"]
    placements.placed(op, "http://b2", "s seg p 0")  # a resend after a reconnect, elsewhere
    assert placements.broker() is None


async def test_wait_returns_once_each_is_placed_or_settled() -> None:
    placements = Placements()
    sent, acked = future(), future()
    placements.tracking(sent)
    placements.tracking(acked)
    waiting = asyncio.create_task(placements.wait(Deadline(10)))
    await asyncio.sleep(0)  # sleep-ok: one turn, so the wait has started
    assert not waiting.done()
    placements.placed(sent, "http://b1", "s")
    await asyncio.sleep(0)  # sleep-ok: one turn for the wait to look again
    assert not waiting.done()  # acked: neither placed nor settled
    acked.set_result(None)
    placements.settled(acked)  # (the transaction's callback on it)
    async with asyncio.timeout(10):
        assert await waiting


async def test_an_operation_placed_before_it_is_tracked_is_not_waited_for() -> None:
    placements = Placements()
    ack = future()
    placements.placed(ack, "http://b1", "a")  # written at once, tracked right after
    placements.tracking(ack)
    async with asyncio.timeout(10):
        assert await placements.wait(Deadline(10))


async def test_wait_gives_up_at_its_deadline() -> None:
    placements = Placements()
    never = future()
    placements.tracking(never)
    async with asyncio.timeout(10):
        assert not await placements.wait(Deadline(0.05))
    placements.settled(never)
    async with asyncio.timeout(10):
        assert await placements.wait(Deadline(0.05))  # settled: nothing to wait for
    never.cancel()


async def test_two_waits_at_once_both_return_once_each_is_placed() -> None:
    """Two waits at once (two ``commit()`` calls of one transaction): both return once
    the operation is placed. The second replaced the first's wake-up, and reset it when it
    returned, so the first waited until its deadline and returned False (the transaction
    then ended at its coordinator instead of in one step)."""
    placements = Placements()
    sent = future()
    placements.tracking(sent)
    first = asyncio.create_task(placements.wait(Deadline(5)))
    second = asyncio.create_task(placements.wait(Deadline(5)))
    await asyncio.sleep(0)  # sleep-ok: one turn, so both waits have started
    placements.placed(sent, "http://b1", "s")
    async with asyncio.timeout(1):  # (their deadline is 5 s)
        assert await first and await second
