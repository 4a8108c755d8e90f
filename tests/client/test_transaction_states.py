"""``Transaction.start()`` opens a new transaction, does nothing on an open one, and refuses
one that has ended, naming its state (found trying the client as a new user: start() of a
committed or aborted transaction returned as if it had started, and one ended before its
first operation was opened again)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from segtxn.client import Client, ClientError, ServerError, TransactionEnded, TransactionState
from segtxn.client.coordinators import Coordinators
from segtxn.client.prestart import Opened
from tests.waiting import wait_until


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
    assert isinstance(refused.value, TransactionEnded)
    assert txn.state == state  # not opened again
    if started:
        assert await txn.status() == state


async def test_an_abort_while_the_transaction_opens_is_not_undone(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send starts the transaction; the application aborts it while NEW_TXN is on its
    way, and the abort stops waiting for it (half its limit). It used to become OPEN when
    NEW_TXN answered, so leaving ``async with`` committed the sends made after the abort.
    The transaction stays ABORTED, the send fails, and what the coordinator opened is
    aborted rather than left OPEN until its timeout (it was left so)."""
    topic = "persistent://acme/states/t"
    await client.admin.create_topic(topic)
    producer = await client.create_producer(topic)
    opening, go_on = asyncio.Event(), asyncio.Event()
    open_ = Coordinators.open

    opened: list[Opened] = []

    async def held_open(self: Coordinators, *args: Any, **kwargs: Any) -> Opened:
        opening.set()
        await go_on.wait()
        opened.append(await open_(self, *args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(Coordinators, "open", held_open)
    txn = client.transaction()
    send = asyncio.create_task(producer.send(b"after the abort", txn=txn))
    async with asyncio.timeout(10):
        await opening.wait()
    await txn.abort(timeout_s=0.2)  # it waits for the start for 0.1 s
    assert txn.state == TransactionState.ABORTED
    go_on.set()
    with pytest.raises(ClientError, match="ABORTED"):
        async with asyncio.timeout(10):
            await send
    assert txn.state == TransactionState.ABORTED
    stats = await client.admin.stats(topic)
    assert stats["msgInCounter"] == 0

    coordinators = client._coordinators
    assert coordinators is not None and len(opened) == 1

    async def aborted() -> bool:
        reply = await coordinators.call("GET", f"/txn/v2/{opened[0].txn}")
        return bool(reply["state"] == "ABORTED")

    await wait_until(aborted, what="the transaction opened after the abort aborted")


@pytest.mark.parametrize("end", ["commit", "abort"])
async def test_an_ended_transaction_with_nothing_in_it_says_why_it_has_no_id(
    client: Client, end: str
) -> None:
    """An empty ``async with client.transaction()`` block commits nothing and never reaches
    a coordinator, so the transaction has no id. Its ``txn.id`` and ``txn.status()`` (the
    README prints both after the block) said "the transaction has not started: it starts
    with its first send or acknowledgment (or call start())", advice it cannot follow: it
    has ended. They now say it ended with nothing in it, and where its outcome is."""
    if end == "commit":
        async with client.transaction() as txn:
            pass
    else:
        txn = client.transaction()
        await txn.abort()
    state = "COMMITTED" if end == "commit" else "ABORTED"
    assert txn.state == state
    expected = (
        f"^the transaction \\(never started\\) is {state}: nothing was sent or acknowledged "
        "in it, so it has no id and no coordinator knows it \\(txn.state says how it ended\\)$"
    )
    with pytest.raises(ClientError, match=expected):
        txn.id  # noqa: B018
    with pytest.raises(ClientError, match=expected):
        await txn.status()


async def test_a_new_transaction_says_it_has_not_started(client: Client) -> None:
    txn = client.transaction()
    with pytest.raises(ClientError, match=r"^the transaction has not started: it starts with"):
        txn.id  # noqa: B018


@pytest.mark.parametrize("started", [True, False])
async def test_commit_of_a_committed_transaction_returns_as_abort_of_an_aborted_one_does(
    client: Client, started: bool
) -> None:
    """Ending a transaction the way it already ended is a harmless success, both ways
    (STYLE 7; Pulsar's ``TransactionUtil.canTransitionTo``): ``abort()`` of an aborted one
    did nothing, while ``commit()`` of a committed one raised TransactionEnded (ABORTABLE),
    telling a caller that retried a commit to abort what had committed."""
    txn = client.transaction()
    if started:
        await txn.start()
    await txn.commit()
    committed_by = txn.committed_by
    await txn.commit()  # returns, changing nothing
    assert txn.state == TransactionState.COMMITTED and txn.committed_by == committed_by
    if started:
        assert await txn.status() == "COMMITTED"
    aborted = client.transaction()
    if started:
        await aborted.start()
    await aborted.abort()
    await aborted.abort()  # (as before)
    with pytest.raises(TransactionEnded, match=r"is ABORTED$"):  # what did not commit never will
        await aborted.commit()
    assert aborted.state == TransactionState.ABORTED
