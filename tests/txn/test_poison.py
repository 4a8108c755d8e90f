"""A send or acknowledgment refused before it left still poisons its transaction."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from segtxn.client import Client, ServerError, Transaction, TransactionFailed
from segtxn.client.consumer import Consumer

SCALABLE = "topic://acme/poison/out"
PERSISTENT = "persistent://acme/poison/out"
OTHER = "topic://acme/poison/other"

Refused = Callable[[Client, Transaction], Awaitable[object]]


async def _send_to_the_other_protocol(client: Client, txn: Transaction) -> object:
    producer = await client.create_producer(PERSISTENT)
    return await producer.send(b"refused", txn=txn)  # a v5 transaction: NotAllowed


async def _send_bad_properties(client: Client, txn: Transaction) -> object:
    producer = await client.create_producer(SCALABLE)
    properties: dict[str, str] = {"n": 1}  # type: ignore[dict-item]  # the mistake under test
    return await producer.send(b"refused", key="k", properties=properties, txn=txn)


async def _ack_a_message_of_another_topic(client: Client, txn: Transaction) -> object:
    producer = await client.create_producer(OTHER)
    other_id = await producer.send(b"elsewhere", key="k")
    consumer = await client.subscribe(SCALABLE, "acks", initial_position="earliest")
    await consumer.acknowledge(other_id, txn=txn)  # ValueError: not its topic
    return None


REFUSALS: dict[str, tuple[Refused, type[Exception]]] = {
    "send to a persistent:// topic in a v5 transaction": (_send_to_the_other_protocol, ServerError),
    "send with a property that is not a string": (_send_bad_properties, TypeError),
    "acknowledgment of another topic's message": (_ack_a_message_of_another_topic, ValueError),
}


async def _nothing_arrives(consumer: Consumer) -> None:
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout_s=0.5)  # bounded absence check


@pytest.mark.parametrize("refusal", REFUSALS, ids=list(REFUSALS))
async def test_an_operation_refused_at_its_call_dooms_the_transaction(
    client: Client, refusal: str
) -> None:
    """The application caught the error and went on to commit: the commit aborts instead
    of counting the rest of the transaction without the refused operation."""
    refuse, raised = REFUSALS[refusal]
    await client.admin.create_topic(SCALABLE, segments=1)
    await client.admin.create_topic(OTHER, segments=1)
    await client.admin.create_topic(PERSISTENT)
    reader = await client.subscribe(SCALABLE, "read", initial_position="earliest")
    producer = await client.create_producer(SCALABLE)
    txn = await client.transaction().start()
    await producer.send(b"good", key="k", txn=txn)
    with pytest.raises(raised) as refused:
        await refuse(client, txn)
    with pytest.raises(TransactionFailed) as failed:
        await txn.commit()
    assert failed.value.__cause__ is refused.value
    assert txn.state == "ABORTED"
    await _nothing_arrives(reader)  # "good" was not committed
