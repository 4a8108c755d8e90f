"""Pre-started transactions (``Client(prestart_transactions=True)``, issue 16): the next
transaction opens in the background, a fresh one is used without a NEW_TXN round trip, a
stale one is aborted instead of used, and the one left at close is aborted; a loop of
transactions opens them in batches (NEW_TXN's ``count``: one call and one store step each),
whose size grows with use and shrinks when spares go stale."""

from __future__ import annotations

import aiohttp
import pytest

from segtxn.client import Client, prestart
from segtxn.client.transaction import Transaction
from segtxn.coordinator.v5 import CoordinatorV5
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
    monkeypatch.setattr(prestart, "PRESTART_MAX_AGE_S", 600.0)  # however slow this machine
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
    monkeypatch.setattr(prestart, "PRESTART_MAX_AGE_S", 0.0)  # every spare is stale
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


async def test_a_loop_of_transactions_opens_them_in_batches_that_grow(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prestart, "PRESTART_MAX_AGE_S", 600.0)
    batches: list[int] = []
    new_txns = CoordinatorV5.new_txns

    async def counted(
        self: CoordinatorV5, count: int, *args: object
    ) -> list[tuple[TxnId, T.TxnHeader]]:
        batches.append(count)
        return await new_txns(self, count, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(CoordinatorV5, "new_txns", counted)
    used: list[TxnId] = []
    async with Client(cluster.url, prestart_transactions=True) as client:
        for _ in range(40):
            txn = await client.transaction().start()
            used.append(txn.id)
            await txn.commit()
    assert len(set(used)) == 40
    assert batches[:6] == [1, 1, 2, 4, 8, 16]  # its own NEW_TXN, then batches as used up
    assert max(batches) == prestart.MAX_BATCH
    assert len(batches) <= 9  # not 41
    assert await open_ids(cluster) == set()  # the spares left were aborted at close
    for txn_id in used:
        assert await state(cluster, txn_id) is TxnState.COMMITTED


async def test_stale_spares_shrink_the_next_batch(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prestart, "PRESTART_MAX_AGE_S", 600.0)
    async with Client(cluster.url, prestart_transactions=True) as client:
        for _ in range(8):  # its own NEW_TXN, then batches of 1, 2, 4 used up: next, 8
            await (await client.transaction().start()).abort()
        spares = next(iter(client._coordinators._spares.values()))  # type: ignore[union-attr]
        assert spares.batch == 8
        monkeypatch.setattr(prestart, "PRESTART_MAX_AGE_S", 0.0)  # every spare is stale now
        txn = await client.transaction().start()
        assert spares.batch == 4
        await txn.abort()
    assert await open_ids(cluster) == set()


@pytest.mark.parametrize(
    ("params", "refused"),
    [
        ({"count": "0"}, "count"),
        ({"count": "17"}, "count"),
        ({"count": "two"}, "count"),
        ({"count": "2", "protocol": "v4"}, "v5 transactions only"),
    ],
)
async def test_new_txn_refuses_a_bad_count(
    cluster: Cluster, params: dict[str, str], refused: str
) -> None:
    url = cluster.coordinator.settings.advertise_url
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/txn/v2/new", params={"timeout_s": "5", **params}) as response,
    ):
        body = await response.json()
    assert response.status == 400, body
    assert body["error"] == "InvalidArgument" and refused in body["message"]
    assert await open_ids(cluster) == set()


async def test_new_txn_with_a_count_opens_that_many_in_one_store_step(cluster: Cluster) -> None:
    url = cluster.coordinator.settings.advertise_url
    steps = cluster.faults.count("txn", key_prefix=T.HEADERS)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/txn/v2/new", params={"timeout_s": "5", "count": "16"}) as response,
    ):
        body = await response.json()
    assert response.status == 200, body
    opened = {TxnId.parse(item["txnId"]) for item in body["transactions"]}
    assert len(opened) == 16 and all(i["state"] == "OPEN" for i in body["transactions"])
    assert steps.calls == 1
    assert await open_ids(cluster) == opened
