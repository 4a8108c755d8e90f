"""Leaving ``async with client.transaction()``: an exception or a cancellation in the block
aborts the transaction, and the block's own exception (or the cancellation) is what comes
out, whatever the abort meets (found trying the client as a new user: with no coordinator
answering, the abort's Timeout replaced the application's exception, and a cancelled task
went on as if it had not been cancelled)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from segtxn.client import Client, ErrorCategory, Timeout
from segtxn.client.coordinators import Coordinators
from segtxn.client.timeouts import Deadline
from segtxn.protocol.txn import TxnAction


class OutOfStock(Exception):
    """The application's own reason to give a transaction up."""


def no_coordinator_answers(monkeypatch: pytest.MonkeyPatch) -> list[TxnAction]:
    """Every END_TXN times out, as with every coordinator paused; returns the actions
    asked for."""
    asked: list[TxnAction] = []

    async def end(self: Coordinators, txn: Any, action: TxnAction, *args: Any) -> None:
        asked.append(action)
        raise Timeout(f"END_TXN {txn}: no answer", category=ErrorCategory.RETRIABLE)

    monkeypatch.setattr(Coordinators, "end", end)
    return asked


async def test_the_blocks_exception_comes_out_when_the_abort_fails(
    client: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    asked = no_coordinator_answers(monkeypatch)
    with pytest.raises(OutOfStock), caplog.at_level(logging.WARNING):
        async with client.transaction() as txn:
            await txn.start()
            raise OutOfStock("order-3")
    assert asked == [TxnAction.ABORT]
    assert txn.state == "OPEN"  # not aborted: its coordinator will, at its timeout
    assert f"transaction {txn.id}: not aborted after OutOfStock (Timeout" in caplog.text


async def test_a_cancelled_block_stays_cancelled_when_the_abort_fails(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = no_coordinator_answers(monkeypatch)
    inside = asyncio.Event()

    async def application() -> None:
        async with client.transaction() as txn:
            await txn.start()
            inside.set()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.create_task(application())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert asked == [TxnAction.ABORT]


async def test_a_cancel_while_the_block_commits_aborts(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task is cancelled while the commit at the end of the block waits for the
    transaction's operations (END_TXN not sent): the transaction used to stay OPEN until
    its timeout, holding its inputs and keeping every reader of its outputs' segments
    waiting; it is aborted, as a cancel in the block is. (With the one-step commit on, the
    commit first waits for the operation to be placed on a broker: a cancel then is the
    same case.)"""
    txn = await client.transaction().start()
    in_flight: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    txn.operations.track(in_flight)  # an operation whose answer has not come
    settling = asyncio.Event()
    settle = txn.operations.settle
    placements = txn._placements
    assert placements is not None  # on by default
    placed = placements.wait

    async def watched(deadline: Deadline) -> bool:
        settling.set()
        return await settle(deadline)

    async def watched_placement(deadline: Deadline) -> bool:
        settling.set()
        return await placed(deadline)

    monkeypatch.setattr(txn.operations, "settle", watched)
    monkeypatch.setattr(placements, "wait", watched_placement)

    async def application() -> None:
        async with txn:
            pass  # the commit waits for in_flight

    task = asyncio.create_task(application())
    await asyncio.wait_for(settling.wait(), 10)
    assert not task.done() and txn.state == "OPEN"  # committing: waiting for it
    task.cancel()
    in_flight.set_result(None)  # it comes right after
    with pytest.raises(asyncio.CancelledError):
        await task
    assert txn.state == "ABORTED"
    assert await txn.status() == "ABORTED"


async def test_a_cancel_once_end_txn_is_sent_does_not_abort(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled after END_TXN(COMMIT) went out, the outcome is unknown (it may have
    committed): the exit must not abort then, and ``commit()`` may be called again."""
    sent, go_on = asyncio.Event(), asyncio.Event()
    end = Coordinators.end

    async def held(self: Coordinators, *args: Any, **kwargs: Any) -> None:
        sent.set()
        await go_on.wait()
        await end(self, *args, **kwargs)

    monkeypatch.setattr(Coordinators, "end", held)
    txn = await client.transaction().start()

    async def application() -> None:
        async with txn:
            pass

    task = asyncio.create_task(application())
    await sent.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert txn.state == "COMMITTING"
    go_on.set()
    await txn.commit()
    assert await txn.status() == "COMMITTED"
