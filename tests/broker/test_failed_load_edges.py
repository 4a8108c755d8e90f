"""A topic's load that fails (segtxn/broker/topic.py, ``Topic.load``) closes every part it
opened, each whatever the ones before it raised, its ledger last and always: a subscription
loaded before the failure whose close then failed (its pending-ack log's clean-close write
refused) skipped the other subscriptions' closes and the ledger's, which kept its file's
lock, and every later load of the topic was refused ("... is held by another writer") until
the broker restarted.

Real components: the cluster's broker and coordinator on its store, files in ``tmp_path``;
the failures are a monkeypatched subscription load and close.
"""

from __future__ import annotations

import asyncio
from typing import NoReturn

import pytest

from segtxn.broker.dispatch import Subscription
from segtxn.broker.subscriptions import Subscriptions
from segtxn.broker.txn.pending_ack_log import pending_ack_log
from segtxn.client import Client, ServerError
from segtxn.ledger.metadata import metadata_key
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster, acked_in_txn, create_and_send

TOPIC = "persistent://acme/load/fails"


async def test_a_failed_load_lets_the_ledger_go_whatever_a_subscription_close_raised(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        await create_and_send(client, TOPIC, b"m0")
        for subscription in ["a", "b", "c"]:
            consumer = await client.subscribe(TOPIC, subscription, initial_position="earliest")
            await consumer.close()
        await service.unload(name)

        real_make = Subscriptions._make_subscription
        made: list[str] = []

        async def third_fails(self: Subscriptions, sub: str, initial: str) -> Subscription:
            if len(made) == 2:
                raise RuntimeError(f"injected: loading {sub!r} failed")
            made.append(sub)
            return await real_make(self, sub, initial)

        real_close = Subscription.close
        closed: list[str] = []

        async def fenced(self: Subscription) -> NoReturn:
            await real_close(self)  # its dispatcher stopped; then its pending-ack log fails
            closed.append(self.name)
            raise RuntimeError("injected: its pending-ack log's close was refused")

        monkeypatch.setattr(Subscriptions, "_make_subscription", third_fails)
        monkeypatch.setattr(Subscription, "close", fenced)
        with pytest.raises(ServerError):
            await client.admin.stats(TOPIC)  # the load fails after two subscriptions loaded
        monkeypatch.undo()
        assert len(made) == 2
        assert closed == made, "a subscription loaded was not closed"
        assert name not in service.topics

        await client.admin.stats(TOPIC)  # loads again: the failed load let go of the ledger
        consumer = await client.subscribe(TOPIC, "t", initial_position="earliest")
        assert (await consumer.receive(timeout_s=10)).value == b"m0"


async def test_a_load_cancelled_with_the_store_silent_lets_the_ledger_go(
    cluster: Cluster,
) -> None:
    """A load cancelled (as a broker's stop cancels the loads in flight) after it loaded
    ``a`` and while it opens ``b``'s pending-ack log, the store silent: ``b``'s open takes
    the cancel's grace, and the failed load's close of ``a`` finds none left, so its
    clean-close write is cut and the close raises the cancel (``run_to_end``). Only
    ``Exception`` was caught: the transaction buffer's and the ledger's closes were
    skipped, the ledger kept its file's lock and every later load was refused ("... is
    held by another writer")."""
    service = cluster.broker.service
    name = TopicName.parse(TOPIC)
    async with Client(cluster.url) as client:
        await (await create_and_send(client, TOPIC, b"m0")).close()
        for sub in ("a", "b"):
            await (await acked_in_txn(client, TOPIC, sub, commit=True)).close()
        await service.unload(name)

        at_b = cluster.faults.hold("txn", key_prefix=metadata_key(pending_ack_log(TOPIC, "b")))
        serving = asyncio.create_task(service.serve(name))
        await at_b.wait_for(1)  # "a" loaded, its log open; "b"'s open waits for the store
        cluster.faults.hold("txn", key_prefix=metadata_key(pending_ack_log(TOPIC, "a")))
        loading = service.loading(name)
        assert loading is not None
        loading.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        cluster.faults.clear()
        at_b.release()

        try:
            await client.admin.stats(TOPIC)  # loads again: the cancelled load let go of it
        except ServerError as e:
            pytest.fail(f"the topic could not be loaded again: {type(e).__name__}: {e}")
        assert {"a", "b"} <= set(service.topics[name].subscriptions)
