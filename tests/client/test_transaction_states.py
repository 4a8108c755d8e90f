"""``Transaction.start()`` opens a new transaction, does nothing on an open one, and refuses
one that has ended, naming its state (found trying the client as a new user: start() of a
committed or aborted transaction returned as if it had started, and one ended before its
first operation was opened again)."""

from __future__ import annotations

import pytest

from segtxn.client import Client, ClientError, ServerError


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
