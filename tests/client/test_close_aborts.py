"""``Client.close()`` aborts the transactions it left open (found trying the client as a
new user: a processor that closed its client with a transaction open, on an error path
that never reached commit() or abort(), held its inputs and kept every reader of the
segments it had written to waiting until the transaction's timeout, a minute by default)."""

from __future__ import annotations

import logging

import pytest

from segtxn.client import Client, ClientClosed
from tests.cluster import Cluster

INPUTS = "topic://acme/closing/in"
OUTPUTS = "topic://acme/closing/out"


async def setup(url: str) -> None:
    async with Client(url) as admin:
        for topic in (INPUTS, OUTPUTS):
            await admin.admin.create_topic(topic, segments=1)
        producer = await admin.create_producer(INPUTS)
        await producer.send(b"order", key="k")
        await admin.subscribe(OUTPUTS, "audit")  # made now: it reads what comes from here


@pytest.mark.parametrize("how", ["close", "async with"])
async def test_a_transaction_left_open_is_aborted_at_close(cluster: Cluster, how: str) -> None:
    await setup(cluster.url)
    client = Client(cluster.url, operation_timeout_s=10)
    await client.__aenter__()
    inputs = await client.subscribe(INPUTS, "billing", initial_position="earliest")
    outputs = await client.create_producer(OUTPUTS)
    order = await inputs.receive(timeout_s=10)
    txn = client.transaction(timeout_s=600)
    await outputs.send(b"invoice", key="k", txn=txn)
    await inputs.acknowledge(order, txn=txn)
    if how == "close":
        await client.close()
    else:
        await client.__aexit__(None, None, None)
    assert txn.state == "ABORTED"
    async with Client(cluster.url) as after:
        others = await after.create_producer(OUTPUTS)
        await others.send(b"plain", key="k")
        audit = await after.subscribe(OUTPUTS, "audit")
        # at once, not in ten minutes: the aborted invoice no longer holds the segment
        assert (await audit.receive(timeout_s=10)).value == b"plain"
        billing = await after.subscribe(INPUTS, "billing")
        assert (await billing.receive(timeout_s=10)).value == b"order"  # released


async def test_a_close_that_may_not_wait_leaves_it_to_its_coordinator(cluster: Cluster) -> None:
    """``close(timeout_s=0)``, what leaving ``async with`` by a cancel does: nothing waits,
    not even for an abort."""
    await setup(cluster.url)
    async with Client(cluster.url) as client:
        outputs = await client.create_producer(OUTPUTS)
        txn = client.transaction(timeout_s=600)
        await outputs.send(b"invoice", key="k", txn=txn)
        await client.close(timeout_s=0)
        assert txn.state == "OPEN"


async def test_the_block_of_a_transaction_its_client_aborted_does_not_look_committed(
    cluster: Cluster,
) -> None:
    """The client closed inside ``async with client.transaction()`` (another task's
    shutdown, say): the block's end must not pass as a commit."""
    await setup(cluster.url)
    async with Client(cluster.url) as client:
        outputs = await client.create_producer(OUTPUTS)
        with pytest.raises(ClientClosed, match="was aborted when its client closed"):
            async with client.transaction() as txn:
                await outputs.send(b"invoice", key="k", txn=txn)
                await client.close()
        assert txn.state == "ABORTED"
        with pytest.raises(ClientClosed, match="was aborted when its client closed"):
            await txn.commit()


async def test_a_second_close_leaves_them_as_the_first_did(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    await setup(cluster.url)
    with caplog.at_level(logging.WARNING):
        async with Client(cluster.url) as client:
            outputs = await client.create_producer(OUTPUTS)
            txn = client.transaction(timeout_s=600)
            await outputs.send(b"invoice", key="k", txn=txn)
            await client.close(timeout_s=0)
    # the exit's close did not try again on a closed client (and warn that it failed)
    assert txn.state == "OPEN"
    assert "not aborted" not in caplog.text
