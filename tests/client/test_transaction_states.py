"""``Transaction.start()`` opens a new transaction, does nothing on an open one, and refuses
one that has ended, naming its state (found trying the client as a new user: start() of a
committed or aborted transaction returned as if it had started, and one ended before its
first operation was opened again)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from segtxn.client import Client, ClientError, ServerError, TransactionState
from segtxn.client.coordinators import Coordinators
from segtxn.client.prestart import Opened


async def test_start_of_an_open_transaction_does_nothing(client: Client) -> None:
    txn = await client.transaction().start()
    opened = txn.id
    assert await txn.start() is txn and txn.id == opened and txn.state == "OPEN"
    assert await txn.status() == "OPEN"
    await txn.abort()


@pytest.mark.parametrize("end", ["commit", "abort"])
@pytest.mark.parametrize("started", [True, False])
async def test_start_of_an_ended_transaction_names_its_state(
    client: Client, end: str, started: bool
) -> None:
    txn = client.transaction()
    if started:
        await txn.start()
    await (txn.commit() if end == "commit" else txn.abort())
    state = "COMMITTED" if end == "commit" else "ABORTED"
    name = f"transaction {txn.id}" if started else "the transaction \\(never started\\)"
    with pytest.raises(ClientError, match=f"^{name} is {state}$") as refused:
        await txn.start()
    assert not isinstance(refused.value, ServerError)
    assert txn.state == state  # not opened again
    if started:
        assert await txn.status() == state


async def test_an_abort_while_the_transaction_opens_is_not_undone(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send starts the transaction; the application aborts it while NEW_TXN is on its
    way. It used to become OPEN when NEW_TXN answered, so leaving ``async with`` committed
    the sends made after the abort. The transition table refuses ABORTED -> OPEN."""
    topic = "persistent://acme/states/t"
    await client.admin.create_topic(topic)
    producer = await client.create_producer(topic)
    opening, go_on = asyncio.Event(), asyncio.Event()
    open_ = Coordinators.open

    async def held_open(self: Coordinators, *args: Any, **kwargs: Any) -> Opened:
        opening.set()
        await go_on.wait()
        return await open_(self, *args, **kwargs)

    monkeypatch.setattr(Coordinators, "open", held_open)
    txn = client.transaction()
    send = asyncio.create_task(producer.send(b"after the abort", txn=txn))
    async with asyncio.timeout(10):
        await opening.wait()
    await txn.abort()
    assert txn.state == TransactionState.ABORTED
    go_on.set()
    with pytest.raises(ClientError, match="ABORTED cannot become OPEN"):
        async with asyncio.timeout(10):
            await send
    assert txn.state == TransactionState.ABORTED
    stats = await client.admin.stats(topic)
    assert stats["msgInCounter"] == 0
