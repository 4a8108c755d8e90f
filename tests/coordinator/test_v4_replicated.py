"""Issue 17 for v4 coordinators: with ``--replication`` a coordinator keeps its transaction
log on the brokers' storage nodes, so another coordinator process, sharing no directory
with it, takes its id over and finishes what it logged; one that was only paused and comes
back serves none of its stale state.

Before, a v4 log lived in the coordinator's data directory: a successor on another host
(a Deployment's new pod) found an empty log, and a transaction caught COMMITTING stayed
so for good.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

from segtxn.client import Client, ServerError
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.protocol.names import TopicName
from tests import processes
from tests.processes import ServerProcess
from tests.waiting import wait_until

TTL = 2.0
V4 = ("--replication", "3/2", "--v4-ids", "1")
"""No --data-dir: whatever a coordinator logs is on the brokers, or nowhere."""


@pytest.fixture
def store_url(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"/v4repl-{os.getpid()}-{uuid.uuid4().hex[:8]}")


async def _state(client: Client, coordinator: ServerProcess, txn: str) -> str | None:
    """The transaction's state as ``coordinator`` reports it (None: not its id, or not yet).
    Asked with a short limit: a coordinator that does not hold the id relays the question
    to the holder, which may be the paused one."""
    try:
        async with asyncio.timeout(2):
            status = await client.connector.request("GET", f"{coordinator.url}/txn/v2/{txn}")
    except (ServerError, OSError, TimeoutError):
        return None
    return str(status["state"])


@pytest.mark.slow
async def test_a_successor_without_the_first_ones_disk_finishes_a_logged_commit(
    store_url: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    brokers = await processes.replicated_brokers(store_url, tmp_path, started, session_ttl=TTL)
    first = processes.coordinator(store_url, "c1", session_ttl=TTL, extra=V4)
    started.append(first)
    first.start()
    await first.ready()
    topic = "persistent://acme/v4repl/orders"
    async with Client(brokers[0].url) as client:
        await client.admin.create_topic(topic)
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        producer = await client.create_producer(topic)
        txn = client.transaction()
        await producer.send(b"x", txn=txn)
        owner = await client.connector.broker_for(TopicName.parse(topic))
        home = next(b for b in brokers if b.url == owner)
        assert home.proc is not None
        home.pause()  # the fan-out cannot finish: the commit stays COMMITTING in the log
        try:
            path = f"{first.url}/txn/v2/{txn.id}/end"
            ending = asyncio.ensure_future(
                client.connector.request("POST", path, params={"action": "COMMIT"})
            )

            async def committing() -> bool:
                return await _state(client, first, str(txn.id)) == "COMMITTING"

            await wait_until(committing, timeout=15, what="COMMITTING logged on two brokers")
            first.kill()
            with pytest.raises(Exception):  # noqa: B017 - the connection died with it
                await ending
        finally:
            home.resume()
        second = processes.coordinator(store_url, "c2", session_ttl=TTL, extra=V4)
        started.append(second)
        second.start()
        await second.ready()

        async def committed() -> bool:
            return await _state(client, second, str(txn.id)) == "COMMITTED"

        await wait_until(committed, timeout=30, what="the successor replaying and committing")
        assert (await consumer.receive(timeout_s=10)).value == b"x"


@pytest.mark.slow
async def test_a_paused_coordinators_id_moves_with_its_log_and_it_serves_no_stale_state(
    store_url: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    brokers = await processes.replicated_brokers(store_url, tmp_path, started, session_ttl=TTL)
    first = processes.coordinator(
        store_url, "c1", session_ttl=TTL, extra=V4, log=tmp_path / "c1.log"
    )
    second = processes.coordinator(store_url, "c2", session_ttl=TTL, extra=V4)
    started += [first, second]
    first.start()
    await first.ready()
    topic = "persistent://acme/v4repl/fenced"
    async with Client(brokers[0].url) as client:
        await client.admin.create_topic(topic)
        opened: list[str] = []

        async def new_txn() -> bool:  # once c1 holds the id and has recovered its log
            try:
                answer = await client.connector.request(
                    "POST", f"{first.url}/txn/v2/new", params={"protocol": "v4", "timeout_s": "600"}
                )
            except ServerError:
                return False
            opened.append(str(answer["txnId"]))
            return True

        await wait_until(new_txn, timeout=30, what="c1 holding the v4 id")
        txn = opened[0]
        assert await _state(client, first, txn) == "OPEN"
        second.start()  # a standby: not ready (it holds no id) until c1 is gone
        await second.serving()  # its port: it is not ready, but it serves
        first.pause()  # past its session: c2 takes the ids and recovers the v4 log

        async def taken_over() -> bool:
            return await _state(client, second, txn) == "OPEN"

        await wait_until(taken_over, timeout=30, what="c2 holding the id with the log replayed")
        path = f"{second.url}/txn/v2/{txn}/end"
        ended = await client.connector.request("POST", path, params={"action": "ABORT"})
        assert ended["state"] == "ABORTED"
        first.resume()

        async def forwards() -> bool:  # its stale OPEN is never served again
            return await _state(client, first, txn) == "ABORTED"

        await wait_until(forwards, timeout=30, what="c1 forwarding to the id's new holder")
        assert "lease lost" in first.log_text()
