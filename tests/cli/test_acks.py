"""``consume``'s acknowledgments in flight (:mod:`segtxn.cli.acks`), with futures the test
answers itself: the counts at any moment, the bound, and what stops the command."""

from __future__ import annotations

import asyncio

import pytest

from segtxn.cli.acks import Acks
from segtxn.client import ClientClosed, ConnectionLost, ErrorCategory, Timeout
from segtxn.protocol.errors import NotAuthorized, ServiceNotReady


def _sent(acks: Acks, n: int) -> list[asyncio.Future[None]]:
    """``n`` messages received, each with its acknowledgment in flight."""
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[None]] = []
    for _ in range(n):
        acks.took()
        futures.append(loop.create_future())
        acks.add(futures[-1])
    return futures


async def _answers_heard() -> None:
    await asyncio.sleep(0)  # sleep-ok: one loop step: the done callbacks run


async def test_every_message_is_acknowledged_failed_or_in_doubt_at_any_moment() -> None:
    acks = Acks(30.0)
    ok, no_answer, refused_for_now, lost_unsent, closed, cancelled, waiting = _sent(acks, 7)
    acks.took()  # received, its acknowledgment not sent yet
    ok.set_result(None)
    no_answer.set_exception(Timeout("no receipt", category=ErrorCategory.OUTCOME_UNKNOWN))
    refused_for_now.set_exception(ServiceNotReady("the store is down"))
    lost_unsent.set_exception(ConnectionLost("gone", category=ErrorCategory.RETRIABLE))
    closed.set_exception(ClientClosed("consumer closed"))
    cancelled.cancel()
    await _answers_heard()
    assert (acks.received, acks.acknowledged, acks.unacknowledged, acks.unknown) == (8, 1, 3, 1)
    # closed before its answer, cancelled, on its way, never sent: applied or not, unknown
    assert acks.in_doubt == 4
    waiting.set_result(None)
    await _answers_heard()
    assert acks.in_doubt == 3 and acks.acknowledged == 2


async def test_room_waits_for_an_answer_once_the_limit_is_in_flight() -> None:
    acks = Acks(30.0, limit=2)
    first, _ = _sent(acks, 2)
    room = asyncio.create_task(acks.room())
    await _answers_heard()
    assert not room.done()
    first.set_result(None)
    async with asyncio.timeout(10):
        await room


async def test_an_acknowledgment_refused_for_good_stops_it_once_the_rest_are_answered() -> None:
    """NotAuthorized is not retriable: the next room() raises it, and settled() waits for
    the acknowledgments still on their way before it does, so nothing is left in doubt."""
    acks = Acks(30.0)
    before, refused, after = _sent(acks, 3)
    before.set_result(None)
    refused.set_exception(NotAuthorized("no consume on acme/orders"))
    await _answers_heard()
    with pytest.raises(NotAuthorized):
        await acks.room()
    settling = asyncio.create_task(acks.settled())
    await _answers_heard()
    assert not settling.done() and acks.in_doubt == 1
    after.set_result(None)
    with pytest.raises(NotAuthorized):
        async with asyncio.timeout(10):
            await settling
    assert (acks.acknowledged, acks.unacknowledged, acks.in_doubt) == (2, 1, 0)


async def test_retriable_failures_stop_it_only_after_the_outage_limit() -> None:
    """Failures go on (counted) while they last no longer than the limit; one answered well
    starts the count again; past the limit the failure stops the command."""
    now = [100.0]
    acks = Acks(30.0, clock=lambda: now[0])
    futures = _sent(acks, 5)

    async def answered(ack: int, error: Exception | None, after_s: float) -> None:
        now[0] += after_s
        if error is None:
            futures[ack].set_result(None)
        else:
            futures[ack].set_exception(error)
        await _answers_heard()  # (the clock is read as the answer is heard)

    await answered(0, ServiceNotReady("down"), 0)
    await answered(1, ServiceNotReady("down"), 29)
    await answered(2, None, 0)  # the outage is over: counted again from the next failure
    await answered(3, ServiceNotReady("down"), 20)
    await acks.room()  # nothing stops it
    await answered(4, ServiceNotReady("still down"), 31)
    with pytest.raises(ServiceNotReady, match="still down"):
        await acks.room()
    assert (acks.unacknowledged, acks.acknowledged, acks.in_doubt) == (4, 1, 0)


async def test_a_receive_waiting_is_given_up_for_a_failure_that_stops_it() -> None:
    """A long idle timeout does not keep a consume whose acknowledgment was refused for good
    waiting for a message: the receive is cancelled and the failure raised."""
    acks = Acks(30.0)
    [refused] = _sent(acks, 1)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    receiving = asyncio.create_task(acks.unless_stopped(never))
    await _answers_heard()
    refused.set_exception(NotAuthorized("no consume"))
    with pytest.raises(NotAuthorized):
        async with asyncio.timeout(10):
            await receiving
    assert never.cancelled()


async def test_a_receive_is_awaited_as_it_is_while_nothing_can_stop_it() -> None:
    acks = Acks(30.0)
    message: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    message.set_result("m")
    assert await acks.unless_stopped(message) == "m"
    [answered] = _sent(acks, 1)
    answered.set_result(None)
    got: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    got.set_result("n")
    assert await acks.unless_stopped(got) == "n"
