"""A full metadata store (etcd's NOSPACE alarm) as brokers and coordinators report it:
503 ``MetadataStoreFull`` with a message telling the operator what to do, retriable (it
passes once an operator frees space, and then nothing needs a restart: a call still
retrying succeeds), and logged at ERROR once, not per request.

On etcd the store is really filled (a private etcd with a tiny quota replaces the suite's
shared one for this module), and then freed the way the error message tells an operator to;
on memory:// (no quota) the fault is injected, then cleared. (Freed before the cluster
stops: stopping on a store that refuses writes does not finish, see the report of this
change.)"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterator

import aiohttp
import pytest

from segtxn import failures
from segtxn.client import Client, ErrorCategory, ErrorName, MetadataStoreFull, Timeout
from segtxn.metastore import StoreFull, open_store
from segtxn.metastore.etcd_server import EtcdServer, find_etcd_binary
from segtxn.metastore.memory import MemoryEngine
from tests.cluster import Cluster
from tests.waiting import wait_until

QUOTA_BYTES = 256 * 1024
CHUNK = b"x" * 60_000
FILL_LIMIT = 1000


@pytest.fixture
def etcd_server() -> Iterator[EtcdServer]:
    """Overrides the suite's shared etcd: this one is filled up, so it is private."""
    server = EtcdServer.in_temp_dir(unsafe_no_fsync=True, quota_backend_bytes=QUOTA_BYTES)
    server.start()
    try:
        yield server
    finally:
        server.stop()


FILLER = "/filling"
"""The namespace the filling writes go to (not the cluster's: the operator deletes it)."""


async def make_full(cluster: Cluster, server: EtcdServer | None) -> None:
    """Fill the store (``server`` None: memory://, where the fault is injected)."""
    if server is None:
        error = StoreFull("injected: etcdserver: mvcc: database space exceeded")
        cluster.faults.fail("txn", error=error, times=None)
        return
    filling = open_store(server.url(FILLER))
    try:
        for i in range(FILL_LIMIT):
            try:
                await filling.put(f"/{i}", CHUNK)
            except StoreFull:
                return
        raise AssertionError("the store is not full")
    finally:
        await filling.close()


async def etcdctl(server: EtcdServer, *args: str) -> str:
    """Run etcdctl (the one beside the etcd binary) against ``server``; its output."""
    command = os.path.join(os.path.dirname(find_etcd_binary()), "etcdctl")
    process = await asyncio.create_subprocess_exec(
        command,
        "--endpoints",
        server.endpoint,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(30):
        out, _ = await process.communicate()
    assert process.returncode == 0, out
    return out.decode()


async def free_space(cluster: Cluster, server: EtcdServer | None) -> None:
    """What an operator does: delete what filled it, compact, defragment, disarm."""
    if server is None:
        cluster.faults.clear()
        return
    await etcdctl(server, "del", "--prefix", FILLER + "/")
    status = json.loads(await etcdctl(server, "endpoint", "status", "-w", "json"))
    await etcdctl(server, "compact", str(status[0]["Status"]["header"]["revision"]))
    await etcdctl(server, "defrag")
    await etcdctl(server, "alarm", "disarm")


@pytest.fixture
def store_full_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh throttle: what other tests logged does not count."""
    monkeypatch.setattr(failures, "STORE_FULL_LOG", failures.Throttled(600.0))


async def test_writes_on_a_full_store_are_503_store_full_logged_once(
    client: Client,
    cluster: Cluster,
    store_full_log: None,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    memory = isinstance(cluster.faults.inner, MemoryEngine)
    server: EtcdServer | None = None if memory else request.getfixturevalue("etcd_server")
    await client.admin.create_topic("topic://acme/full/before", segments=1)
    await make_full(cluster, server)
    caplog.clear()
    async with aiohttp.ClientSession() as http:
        for i in range(2):
            url = f"{cluster.url}/admin/v2/topic/acme/full/t{i}"
            async with http.put(url) as answer:
                assert answer.status == 503, await answer.text()
                assert answer.headers["X-Segtxn-Error"] == ErrorName.METADATA_STORE_FULL
                body = await answer.json()
    for word in ("compact", "defrag", "quota", "alarm disarm"):
        assert word in body["message"], body
    with pytest.raises(MetadataStoreFull) as refused:  # an admin call is not retried
        await client.admin.create_topic("topic://acme/full/t2", segments=1)
    assert refused.value.retriable and refused.value.category is ErrorCategory.RETRIABLE
    with pytest.raises(Timeout) as coordinator:  # NEW_TXN writes its header: retried
        await client.transaction().start(timeout_s=1.0)
    assert isinstance(coordinator.value.last_error, MetadataStoreFull), coordinator.value
    assert "MetadataStoreFull" in str(coordinator.value)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "NOSPACE" in errors[0].getMessage() and not errors[0].exc_info
    assert await client.admin.list_topics("topic", "acme", "full") == [
        "topic://acme/full/before"
    ]  # reads still work
    refusals = failures.STORE_FULL_LOG.since
    waiting = asyncio.create_task(client.transaction().start(timeout_s=30))
    await wait_until(lambda: failures.STORE_FULL_LOG.since > refusals, what="a refused start")
    assert not waiting.done()  # still retrying, not failed
    await free_space(cluster, server)
    await asyncio.wait_for(waiting, timeout=15)  # recovers by itself, no restart
    await client.admin.create_topic("topic://acme/full/after", segments=1)  # writes again


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)  # (an injected fault)
async def test_clean_ups_retrying_on_a_full_store_log_it_once(
    client: Client,
    cluster: Cluster,
    store_full_log: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The brokers' background clean-ups after a commit (op records, the watermark, the
    cursor) retry every second while the store is full: one ERROR line for them all, not a
    WARNING per segment and subscription per second (a log flood on a large cluster)."""
    for topic in ("topic://acme/clean/in", "topic://acme/clean/out"):
        await client.admin.create_topic(topic, segments=2)
    inputs = await client.subscribe("topic://acme/clean/in", "s", initial_position="earliest")
    feeder = await client.create_producer("topic://acme/clean/in")
    outputs = await client.create_producer("topic://acme/clean/out")
    for i in range(8):
        await feeder.send(b"%d" % i, key=f"k{i}")
    async with client.transaction(timeout_s=30) as txn:
        for _ in range(8):
            message = await inputs.receive(timeout_s=10)
            await outputs.send(message.value, key=message.key, txn=txn)
            await inputs.acknowledge(message, txn=txn)
    caplog.clear()
    writes = cluster.faults.count("txn")
    cluster.faults.fail("txn", error=StoreFull("injected: database space exceeded"), times=None)
    await wait_until(lambda: writes.calls >= 12, timeout=20, what="clean-ups retrying")
    noisy = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "space exceeded" in r.getMessage()
    ]
    assert len(noisy) <= 1, noisy
    cluster.faults.clear()
    async with client.transaction(timeout_s=30) as txn:  # and it goes on, nothing restarted
        await outputs.send(b"after", key="k0", txn=txn)
