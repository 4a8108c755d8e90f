"""A ``txn`` that is not a Transaction, or an acknowledgment of something that is not a
message, is a TypeError at the call (found trying the client as a new user: both were an
AttributeError from deep inside, ``'str' object has no attribute 'poison'``)."""

from __future__ import annotations

from typing import Any

import pytest

from segtxn.client import Client

TOPIC = "topic://acme/types/in"


async def test_a_txn_that_is_not_a_transaction_is_a_type_error(client: Client) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
    await producer.send(b"m", key="k")
    message = await consumer.receive(timeout_s=10)
    txn = await client.transaction().start()
    wrong: Any = str(txn.id)
    for call in (
        lambda: producer.send(b"v", key="k", txn=wrong),
        lambda: producer.send_async(b"v", key="k", txn=wrong),
        lambda: consumer.acknowledge(message, txn=wrong),
        lambda: consumer.acknowledge_async(message, txn=wrong),
    ):
        with pytest.raises(TypeError, match=r"^txn is a Transaction .* or None, not str$"):
            await call()
    await txn.commit()  # nothing reached it


@pytest.mark.parametrize("wrong", [None, "segment://acme/types/in/0@1:0", ("t", 1, 0)])
async def test_acknowledging_what_is_not_a_message_is_a_type_error(
    client: Client, wrong: Any
) -> None:
    await client.admin.create_topic(TOPIC, segments=1)
    consumer = await client.subscribe(TOPIC, "s")
    txn = client.transaction()
    for call in (
        lambda: consumer.acknowledge(wrong),
        lambda: consumer.acknowledge_async(wrong, txn=txn),
        lambda: consumer.acknowledge_cumulative(wrong),
        lambda: consumer.negative_acknowledge(wrong),
    ):
        with pytest.raises(TypeError, match=r"^a Message \(or its message_id\) received"):
            await call()


async def test_a_message_of_another_subscription_is_refused_and_stays_unconsumed(
    client: Client,
) -> None:
    """Acknowledged on a consumer of another subscription, a message would count as
    consumed there, where it may never have been delivered: that subscription would never
    see it (found trying the client as a new user; in a transaction the broker refused it,
    but about delivery epochs). Refused at the call, naming both subscriptions."""
    await client.admin.create_topic(TOPIC, segments=1)
    producer = await client.create_producer(TOPIC)
    billing = await client.subscribe(TOPIC, "billing", initial_position="earliest")
    audit = await client.subscribe(TOPIC, "audit", initial_position="earliest")
    await producer.send(b"m", key="k")
    message = await billing.receive(timeout_s=10)
    assert message.subscription == "billing"
    txn = client.transaction()
    said = r"was delivered to subscription 'billing', not 'audit'"
    for call in (
        lambda: audit.acknowledge(message),
        lambda: audit.acknowledge_async(message, txn=txn),
        lambda: audit.acknowledge_cumulative(message),
        lambda: audit.negative_acknowledge(message),
    ):
        with pytest.raises(ValueError, match=said):
            await call()
    assert (await audit.receive(timeout_s=10)).value == b"m"  # still audit's to consume
    await audit.acknowledge(message.message_id)  # an id says nothing of a subscription
    await billing.acknowledge(message)
