"""Pre-started transactions (``Client(prestart_transactions=True)``, issue 16): the next
transaction opens in the background, a fresh one is used without a NEW_TXN round trip, a
stale one is aborted instead of used, and the one left at close is aborted."""

from __future__ import annotations

import pytest

from segtxn.client import Client
from segtxn.client import coordinators as client_txn
from segtxn.client.transaction import Transaction
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T
from tests.cluster import Cluster
from tests.waiting import wait_until


async def open_ids(cluster: Cluster) -> set[TxnId]:
    return {txn for txn, _ in await cluster.coordinator.coordinator.list_open()}


async def state(cluster: Cluster, txn: TxnId) -> TxnState | None:
    record = await cluster.store.get(T.header_key(txn))
    return None if record is None else T.decode_header(record.value).state


async def start_with_spare(client: Client, cluster: Cluster) -> tuple[Transaction, TxnId]:
    """Start a transaction; return it and the one opened in the background meanwhile."""
    first = await client.transaction().start()

    async def spare_opened() -> bool:
        return len(await open_ids(cluster)) == 2

    await wait_until(spare_opened, what="the next transaction opened in the background")
    (spare,) = await open_ids(cluster) - {first.id}
    return first, spare


async def test_a_prestarted_transaction_is_used_without_a_round_trip(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_txn, "PRESTART_MAX_AGE_S", 600.0)  # however slow this machine
    async with Client(cluster.url, prestart_transactions=True) as client:
        first, spare = await start_with_spare(client, cluster)
        await first.commit()
        second = await client.transaction().start()
        assert second.id == spare
        await second.commit()
        assert await state(cluster, spare) is TxnState.COMMITTED


async def test_a_stale_prestarted_transaction_is_aborted_not_used(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_txn, "PRESTART_MAX_AGE_S", 0.0)  # every spare is stale
    async with Client(cluster.url, prestart_transactions=True) as client:
        first, spare = await start_with_spare(client, cluster)
        second = await client.transaction().start()
        assert second.id not in (first.id, spare)

        async def spare_aborted() -> bool:
            return await state(cluster, spare) is TxnState.ABORTED

        await wait_until(spare_aborted, what="the stale spare aborted")
        await first.abort()
        await second.abort()


async def test_the_spare_left_at_close_is_aborted(cluster: Cluster) -> None:
    async with Client(cluster.url, prestart_transactions=True) as client:
        first = await client.transaction().start()
        await first.commit()
    assert cluster.coordinator.coordinator.counters["opened"] == 2  # the spare was opened
    assert await open_ids(cluster) == set()  # and the close aborted it


async def test_without_the_option_nothing_opens_in_the_background(cluster: Cluster) -> None:
    async with Client(cluster.url) as client:
        first = await client.transaction().start()
        assert await open_ids(cluster) == {first.id}
        await first.commit()
    assert cluster.coordinator.coordinator.counters["opened"] == 1
