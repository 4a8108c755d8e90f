"""An ack repeated in the same transaction is a no-op; one in another transaction names it."""

from __future__ import annotations

import pytest

from segtxn.client import Client, ErrorName, Message, ServerError
from segtxn.client.consumer import Consumer

TOPIC = "topic://acme/again/in"


async def _fed(client: Client, count: int, subscription_type: str = "Exclusive") -> Consumer:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    for i in range(count):
        await producer.send(f"m{i}".encode(), key="k")
    return await client.subscribe(
        TOPIC, "s", initial_position="earliest", subscription_type=subscription_type
    )


async def _nothing_more(consumer: Consumer) -> None:
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout_s=0.5)  # bounded absence check


@pytest.mark.parametrize("cumulative", [False, True], ids=["individual", "cumulative"])
async def test_the_same_ack_twice_in_one_transaction_commits(
    client: Client, cumulative: bool
) -> None:
    """A client may send an ack again (a retry after a lost receipt): the transaction that
    holds it already holds it, and its commit counts it once."""
    consumer = await _fed(client, 2)
    first: Message = await consumer.receive(timeout_s=10)
    second: Message = await consumer.receive(timeout_s=10)
    ack = consumer.acknowledge_cumulative if cumulative else consumer.acknowledge
    async with client.transaction() as txn:
        await ack(first, txn=txn)
        await ack(first, txn=txn)
        await ack(second, txn=txn)
        await ack(second, txn=txn)
    assert txn.state == "COMMITTED"
    stats = await client.admin.stats(TOPIC)
    backlog = sum(
        s["stats"]["subscriptions"]["s"]["backlog"] for s in stats["segments"] if s.get("stats")
    )
    assert backlog == 0
    await _nothing_more(consumer)


async def test_an_ack_held_by_another_transaction_says_which(client: Client) -> None:
    consumer = await _fed(client, 1)
    message = await consumer.receive(timeout_s=10)
    holding = await client.transaction().start()
    await consumer.acknowledge(message, txn=holding)
    other = await client.transaction().start()
    with pytest.raises(ServerError) as refused:
        await consumer.acknowledge(message, txn=other)
    assert refused.value.name is ErrorName.TRANSACTION_CONFLICT
    assert f"is acknowledged by transaction {holding.id}, still open" in str(refused.value)
    await other.abort()
    await holding.commit()
    await _nothing_more(consumer)
