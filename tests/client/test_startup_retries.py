"""Creating producers, consumers and readers gets through a broker or its store restarting
(soak finding F1), and a client given several service URLs uses the one that answers."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import uuid
from pathlib import Path

import pytest

from segtxn.client import Client, ErrorName, ServerError, Timeout
from segtxn.metastore.etcd_server import EtcdServer, free_port
from tests import processes
from tests.cluster import Cluster
from tests.processes import ServerProcess
from tests.waiting import wait_until

P = "persistent://acme/restart/events"
S = "topic://acme/restart/keyed"
SLACK_S = 1.0


@pytest.fixture
def store(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"/retries-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def retries(caplog: pytest.LogCaptureFixture, what: str) -> int:
    """How many attempts of calls naming ``what`` failed and were tried again."""
    return sum(
        1
        for r in caplog.records
        if r.name == "segtxn.client.timeouts" and what in r.getMessage() and "again" in r.msg
    )


def tried_again(caplog: pytest.LogCaptureFixture, what: str) -> bool:
    return retries(caplog, what) >= 1


@pytest.mark.slow
async def test_start_up_calls_wait_out_a_broker_restart(
    store: str, tmp_path: Path, started: list[ServerProcess], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="segtxn.client.timeouts")
    # restarted after a SIGKILL, it waits for its old session to expire before it serves:
    # a 2 s session, not the 10 s default (the calls wait out the restart whatever it takes)
    broker = processes.broker(store, tmp_path / "b1", "b1", session_ttl=2)
    started.append(broker)
    broker.start()
    await broker.ready()
    async with Client(broker.url, operation_timeout_s=30) as client:
        await client.admin.create_topic(P)
        await client.admin.create_topic(S, segments=2)
        broker.kill()

        with pytest.raises(Timeout) as gone:  # down for longer than the call may wait
            await client.create_producer(P, timeout_s=1)
        assert isinstance(gone.value.last_error, ServerError)
        assert gone.value.last_error.name is ErrorName.SERVICE_NOT_READY
        assert "cannot reach" in str(gone.value) and gone.value.retriable

        loop = asyncio.get_running_loop()
        started_at = loop.time()
        calls = {
            f"on {P}": client.create_producer(P),
            f"look {S} up": client.subscribe(S, "s", initial_position="earliest"),
            f"attach a reader to {P}": client.create_reader(P),
        }
        tasks = [asyncio.create_task(call) for call in calls.values()]
        try:
            for what in calls:  # each has found the broker down at least once
                await wait_until(functools.partial(tried_again, caplog, what), what=what)
            broker.start()  # same id, data and port
            producer, consumer, reader = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        assert loop.time() - started_at < 30
        await producer.send(b"after")  # type: ignore[union-attr]
        assert (await reader.receive(timeout_s=10)).value == b"after"  # type: ignore[union-attr]
        keyed = await client.create_producer(S)
        await keyed.send(b"k", key="k")
        assert (await consumer.receive(timeout_s=10)).value == b"k"  # type: ignore[union-attr]


async def test_a_lookup_the_store_cannot_answer_is_retried(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker is up but cannot read its metadata store: lookups answer ServiceNotReady
    (retriable), so subscribing waits for the store instead of failing."""
    caplog.set_level(logging.DEBUG, logger="segtxn.client.timeouts")
    async with Client(cluster.url, operation_timeout_s=30) as client:
        await client.admin.create_topic(S, segments=2)
        cluster.faults.fail("range", key_prefix="/homes/", times=None)
        subscribing = asyncio.create_task(client.subscribe(S, "s", initial_position="earliest"))
        try:
            await wait_until(lambda: retries(caplog, "ServiceNotReady") >= 2, what="retries")
            cluster.faults.clear()
            consumer = await subscribing
        finally:
            subscribing.cancel()
            await asyncio.gather(subscribing, return_exceptions=True)
        producer = await client.create_producer(S)
        await producer.send(b"x", key="k")
        assert (await consumer.receive(timeout_s=10)).value == b"x"


@pytest.mark.slow
async def test_several_service_urls_one_down_one_paused(
    store: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    b1 = processes.broker(store, tmp_path / "b1", "b1")
    b2 = processes.broker(store, tmp_path / "b2", "b2")
    started += [b1, b2]
    b1.start()
    await b1.ready()
    async with Client(b1.url) as client:  # every topic on b1: b2 is not up yet
        await client.admin.create_topic(P)
        await client.admin.create_topic(S, segments=2)
    b2.start()
    await b2.ready()
    loop = asyncio.get_running_loop()

    refused = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with Client(f"{refused},{b1.url}") as client:
        started_at = loop.time()
        assert (await client.admin.stats(P))["msgInCounter"] == 0
        producer = await client.create_producer(P)
        await producer.send(b"via b1")
        assert loop.time() - started_at < SLACK_S
        assert client.connector.service_url == b1.url

    b2.pause()  # it accepts connections and answers nothing
    try:
        async with Client([b2.url, b1.url], request_timeout_s=0.5) as client:
            started_at = loop.time()
            consumer = await client.subscribe(S, "s", initial_position="earliest")
            assert loop.time() - started_at < 0.5 + SLACK_S  # one cut attempt, then b1
            assert (await client.admin.stats(P))["msgInCounter"] == 1
            keyed = await client.create_producer(S)
            await keyed.send(b"k", key="k")
            assert (await consumer.receive(timeout_s=10)).value == b"k"
    finally:
        b2.resume()


def test_service_urls_are_checked() -> None:
    for bad in ("", " , ", "b1:8080", ["http://b1:8080", "ftp://b2"]):
        with pytest.raises(ValueError):
            Client(bad)
    assert Client("http://b1:8080/, http://b2:8080").service_urls == [
        "http://b1:8080",
        "http://b2:8080",
    ]
    with pytest.raises(ValueError):
        Client("http://b1:8080", operation_timeout_s=0)
