"""A transaction belongs to the role that opened it: another role, even one with the same
rights on the namespace, cannot write in it (``send``, ``send_batch``), acknowledge in it
(``ack``) or ask for its redelivery (``redeliver``), nor join, end or inspect it at the
coordinator (tests/auth/test_matrix.py); a refused frame stores nothing. The owner and a
superuser can. And the Python client, given a token, does all of it as usual."""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from segtxn.cli.commands import main
from segtxn.client import Client
from segtxn.coordinator.app import COORDINATOR, V4, CoordinatorServer
from segtxn.metastore import Record
from segtxn.protocol import frames, txnops
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.txn import TxnId
from segtxn.topics import transactions as T
from segtxn.web import Listener
from tests.auth.conftest import CONSUMER, PRODUCER, PRODUCER_2, ROOT, SecureCluster, bearer, token
from tests.wsframes import next_frame

SEGMENT = "segment/acme/orders/sc/0"
T1 = "persistent://acme/orders/t1"
_names = itertools.count(1)


@pytest.fixture
async def topics(secure: SecureCluster) -> SecureCluster:
    async with Client(secure.url, token=token(ROOT)) as client:
        await client.admin.create_topic("topic://acme/orders/sc", segments=1)
        await client.admin.create_topic(T1)
    return secure


async def _open(http: aiohttp.ClientSession, cluster: SecureCluster, role: str, v4: bool) -> TxnId:
    query = "?protocol=v4" if v4 else ""
    async with http.post(
        f"{cluster.txn_url}/txn/v2/new{query}", headers=bearer(token(role))
    ) as answer:
        assert answer.status == 200, await answer.text()
        return TxnId.parse((await answer.json())["txnId"])


async def _coordinator(
    http: aiohttp.ClientSession, cluster: SecureCluster, role: str, path: str, body: Any = None
) -> int:
    async with http.post(cluster.txn_url + path, json=body, headers=bearer(token(role))) as answer:
        return answer.status


async def _producer(
    http: aiohttp.ClientSession, cluster: SecureCluster, role: str, path: str
) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(
        f"{cluster.url}/ws/v2/producer/{path}?name=p{next(_names)}", headers=bearer(token(role))
    )
    assert isinstance(await next_frame(ws), frames.ProducerReady)
    return ws


async def _send(ws: aiohttp.ClientWebSocketResponse, frame: frames.Frame) -> None:
    await ws.send_bytes(frames.encode(frame))


async def _committed(http: aiohttp.ClientSession, cluster: SecureCluster, path: str) -> list[bytes]:
    """Every visible message of ``path``, read from the start by a superuser's reader."""
    url = f"{cluster.url}/ws/v2/reader/{path}?start=earliest&end=latest"
    got = []
    async with http.ws_connect(url, headers=bearer(token(ROOT))) as ws:
        await _send(ws, frames.Flow(permits=100))
        while not isinstance(frame := await next_frame(ws), frames.EndOfTopic):
            assert isinstance(frame, frames.Message), frame
            got.append(frame.payload)
    return got


@pytest.mark.parametrize("v4", [False, True], ids=["v5 segment", "v4 persistent"])
async def test_another_roles_transaction_cannot_be_written_in(
    topics: SecureCluster, v4: bool
) -> None:
    path = "persistent/acme/orders/t1" if v4 else SEGMENT
    async with aiohttp.ClientSession() as http:
        opened = await _open(http, topics, PRODUCER, v4)
        txn = (opened.most, opened.least)
        if v4:
            join = f"/txn/v2/{opened}/partitions"
            assert await _coordinator(http, topics, PRODUCER, join, {"topics": [T1]}) == 204
        intruder = await _producer(http, topics, PRODUCER_2, path)
        await _send(intruder, frames.Send(seq=1, payload=b"forged", txn=txn))
        refused = await next_frame(intruder)
        assert isinstance(refused, frames.Error) and refused.seq == 1
        assert refused.error == ErrorName.NOT_AUTHORIZED, refused
        batch = [
            frames.Send(seq=2, payload=b"forged-too", txn=txn),
            frames.Send(seq=3, payload=b"plain"),
        ]
        await _send(intruder, frames.SendBatch(sends=batch))
        answers: dict[int | None, frames.Frame] = {}
        for _ in range(2):
            answer = await next_frame(intruder)
            assert isinstance(answer, frames.Error | frames.Receipt), answer
            answers[answer.seq] = answer
        assert isinstance(answers[2], frames.Error)
        assert answers[2].error == ErrorName.NOT_AUTHORIZED
        assert isinstance(answers[3], frames.Receipt)  # its own sends go on
        await intruder.close()

        owner = await _producer(http, topics, PRODUCER, path)
        await _send(owner, frames.Send(seq=1, payload=b"mine", txn=txn))
        assert isinstance(await next_frame(owner), frames.Receipt)
        await owner.close()
        end = f"/txn/v2/{opened}/end?action=COMMIT"
        assert await _coordinator(http, topics, PRODUCER_2, end) == 403
        assert await _coordinator(http, topics, PRODUCER, end) == 200
        assert sorted(await _committed(http, topics, path)) == [b"mine", b"plain"]


async def _consumer(
    http: aiohttp.ClientSession, cluster: SecureCluster, role: str, subscription: str
) -> tuple[aiohttp.ClientWebSocketResponse, frames.Message]:
    ws = await http.ws_connect(
        f"{cluster.url}/ws/v2/consumer/{SEGMENT}/{subscription}?initial=earliest",
        headers=bearer(token(role)),
    )
    assert isinstance(await next_frame(ws), frames.ConsumerReady)
    await _send(ws, frames.Flow(permits=10))
    message = await next_frame(ws)
    assert isinstance(message, frames.Message), message
    return ws, message


async def test_another_roles_transaction_cannot_acknowledge_or_redeliver(
    topics: SecureCluster,
) -> None:
    async with aiohttp.ClientSession() as http:
        writer = await _producer(http, topics, PRODUCER, SEGMENT)
        await _send(writer, frames.Send(seq=1, payload=b"m"))
        assert isinstance(await next_frame(writer), frames.Receipt)
        await writer.close()
        opened = await _open(http, topics, PRODUCER_2, v4=False)
        txn = (opened.most, opened.least)

        ws, message = await _consumer(http, topics, CONSUMER, "intruder")
        ack = frames.Ack(message_ids=[message.message_id], request_id=7, txn=txn)
        await _send(ws, ack)
        refused = await next_frame(ws)
        assert isinstance(refused, frames.Error) and refused.request_id == 7
        assert refused.error == ErrorName.NOT_AUTHORIZED
        await _send(ws, frames.Redeliver(request_id=8, txn=txn))
        refused = await next_frame(ws)
        assert isinstance(refused, frames.Error) and refused.request_id == 8
        assert refused.error == ErrorName.NOT_AUTHORIZED
        await _send(ws, frames.Ack(message_ids=[message.message_id], request_id=9))
        assert await next_frame(ws) == frames.AckReceipt(request_id=9)  # plain acks go on
        await ws.close()

        ws, message = await _consumer(http, topics, PRODUCER_2, "owner")
        await _send(ws, frames.Ack(message_ids=[message.message_id], request_id=1, txn=txn))
        assert await next_frame(ws) == frames.AckReceipt(request_id=1)
        await ws.close()


async def _sent_in_own_transaction(
    http: aiohttp.ClientSession, cluster: SecureCluster
) -> tuple[TxnId, aiohttp.ClientWebSocketResponse, int]:
    """A v5 transaction PRODUCER opened, one message it sent in it to SEGMENT (stored), the
    producer connection that sent it, and the one-step commit's digest of that send."""
    opened = await _open(http, cluster, PRODUCER, v4=False)
    ws = await http.ws_connect(
        f"{cluster.url}/ws/v2/producer/{SEGMENT}?name=owned", headers=bearer(token(PRODUCER))
    )
    assert isinstance(await next_frame(ws), frames.ProducerReady)
    await _send(ws, frames.Send(seq=0, payload=b"mine", txn=(opened.most, opened.least)))
    assert isinstance(await next_frame(ws), frames.Receipt)
    return opened, ws, txnops.digest([txnops.send_op("segment://acme/orders/sc/0", "owned", 0)])


async def test_only_the_owner_may_commit_at_the_broker(topics: SecureCluster) -> None:
    """The one-step commit (``POST /txn/v2/{txn}/commit`` on the broker) checks the owner
    as END_TXN does."""
    async with aiohttp.ClientSession() as http:
        opened, ws, summed = await _sent_in_own_transaction(http, topics)
        await ws.close()
        body = {"ops": 1, "digest": summed}
        commit = f"{topics.url}/txn/v2/{opened}/commit"
        async with http.post(commit, json=body, headers=bearer(token(PRODUCER_2))) as answer:
            assert answer.status == 403
        async with http.post(commit, json=body, headers=bearer(token(PRODUCER))) as answer:
            assert (answer.status, await answer.json()) == (200, {"state": "COMMITTED"})
        assert await _committed(http, topics, SEGMENT) == [b"mine"]


async def test_only_the_owner_may_commit_with_a_frame(topics: SecureCluster) -> None:
    """The ``commit`` frame on a producer connection checks the owner as the request does:
    another role's, refused by its request id, commits nothing; the owner's does."""
    async with aiohttp.ClientSession() as http:
        opened, mine, summed = await _sent_in_own_transaction(http, topics)
        commit = frames.Commit(request_id=5, txn=(opened.most, opened.least), ops=1, digest=summed)
        other = await _producer(http, topics, PRODUCER_2, SEGMENT)
        await _send(other, commit)
        refused = await next_frame(other)
        assert isinstance(refused, frames.Error)
        assert (refused.error, refused.request_id) == (ErrorName.NOT_AUTHORIZED.value, 5)
        await _send(mine, commit)
        assert await next_frame(mine) == frames.CommitAnswer(request_id=5, state="COMMITTED")
        await other.close()
        await mine.close()
        assert await _committed(http, topics, SEGMENT) == [b"mine"]


async def test_a_superuser_may_end_any_transaction(topics: SecureCluster) -> None:
    async with aiohttp.ClientSession() as http:
        txn = await _open(http, topics, PRODUCER, v4=False)
        assert await _coordinator(http, topics, ROOT, f"/txn/v2/{txn}/end?action=ABORT") == 200
        async with http.get(f"{topics.txn_url}/txn/v2/{txn}", headers=bearer(token(ROOT))) as a:
            assert (await a.json())["owner"] == PRODUCER


async def test_the_owner_check_of_a_commit_reads_no_header_this_coordinator_made(
    topics: SecureCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With security on, END_TXN still costs one store call, the CAS: the owner of a
    transaction this coordinator opened is known (it never changes). Another role is
    still refused, and a transaction it did not open (read from the store) still checked."""
    coordinator = topics.coordinator.app[COORDINATOR]
    reads: list[str] = []
    original = coordinator.store.get

    async def counted(key: str) -> Record | None:
        reads.append(key)
        return await original(key)

    monkeypatch.setattr(coordinator.store, "get", counted)
    async with aiohttp.ClientSession() as http:
        mine = await _open(http, topics, PRODUCER, v4=False)
        theirs = await _open(http, topics, PRODUCER, v4=False)
        headers = {T.header_key(mine), T.header_key(theirs)}
        commit = f"/txn/v2/{mine}/end?action=COMMIT"
        assert await _coordinator(http, topics, PRODUCER, commit) == 200
        assert [k for k in reads if k in headers] == []
        end = f"/txn/v2/{theirs}/end?action=COMMIT"
        assert await _coordinator(http, topics, PRODUCER_2, end) == 403
        coordinator._created.clear()  # as after a restart: the owner comes from the store
        assert await _coordinator(http, topics, PRODUCER_2, end) == 403
        assert [k for k in reads if k in headers] == [T.header_key(theirs)]
        assert await _coordinator(http, topics, PRODUCER, end) == 200


async def test_the_client_with_a_token_does_transactions_as_usual(topics: SecureCluster) -> None:
    async with Client(topics.url, token=token(PRODUCER_2)) as client:
        producer = await client.create_producer("topic://acme/orders/sc")
        consumer = await client.subscribe(
            "topic://acme/orders/sc", "app", initial_position="earliest"
        )
        async with client.transaction() as txn:
            await producer.send(b"in-txn", key="k", txn=txn)
        assert (await consumer.receive(timeout_s=10)).value == b"in-txn"
    async with Client(topics.url) as anonymous:
        with pytest.raises(ServerError) as caught:
            await anonymous.create_producer("topic://acme/orders/sc", timeout_s=5)
        assert caught.value.name is ErrorName.UNAUTHENTICATED


async def test_the_token_comes_from_segtxn_token(
    topics: SecureCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEGTXN_TOKEN", token(CONSUMER))
    async with Client(topics.url) as client:
        assert await client.admin.subscriptions(T1) == []
        with pytest.raises(ServerError) as caught:
            await client.admin.create_topic("persistent://acme/orders/not-mine")
        assert caught.value.name is ErrorName.NOT_AUTHORIZED


async def test_the_cli_sends_its_token(topics: SecureCluster) -> None:
    runner = CliRunner()
    env = {k: v for k, v in os.environ.items() if k != "SEGTXN_TOKEN"}

    def cli(*args: str) -> Any:
        return runner.invoke(main, list(args), env=env)

    create = ["topics", "create", "--url", topics.url, "persistent://acme/orders/cli"]
    refused = await asyncio.to_thread(cli, *create)
    assert refused.exit_code == 1 and "Unauthenticated" in refused.output, refused.output
    done = await asyncio.to_thread(cli, "--token", token(ROOT), *create)
    assert done.exit_code == 0, done.output
    assert "created persistent://acme/orders/cli" in done.output


async def test_a_relayed_call_is_checked_as_its_caller(
    secure: SecureCluster, tmp_path: Path
) -> None:
    """A v4 call to a coordinator that does not hold the id is relayed to the holder with
    the caller's token, not the relaying server's (a superuser's): the owner check holds."""
    settings = secure.coordinator.settings
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    standby = CoordinatorServer(
        replace(settings, advertise_url=f"http://127.0.0.1:{listener.port}"),
        store=secure.store,
        listener=listener,
    )
    await standby.start()
    try:
        async with aiohttp.ClientSession() as http:
            txn = await _open(http, secure, PRODUCER, v4=True)
            assert txn.most not in standby.app[V4].held
            status = f"{standby.settings.advertise_url}/txn/v2/{txn}"
            async with http.get(status, headers=bearer(token(PRODUCER_2))) as answer:
                assert answer.status == 403
                assert answer.headers["X-Segtxn-Error"] == "NotAuthorized"
            async with http.get(status, headers=bearer(token(PRODUCER))) as answer:
                assert answer.status == 200
                assert (await answer.json())["owner"] == PRODUCER
    finally:
        await standby.stop()
