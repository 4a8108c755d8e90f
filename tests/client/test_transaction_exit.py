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
