"""A broker's claim on its id (segtxn/broker/registration.py), on both stores and as real
processes: a second broker with a live broker's id is refused and changes nothing; a broker
killed with SIGKILL starts again with its id once its old session expires; a broker whose
registration is deleted or taken behind its back is not ready until it holds it again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from segtxn.broker.app import BrokerServer
from segtxn.broker.registration import BrokerIdTaken, grace_s
from segtxn.broker.settings import BrokerSettings
from segtxn.client import Client
from segtxn.metastore import MetadataStore, StoreAccessDenied, open_store
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.metastore.faults import FaultInjector
from segtxn.topics.catalog import Catalog, broker_key
from segtxn.web import Listener
from tests import processes
from tests.processes import ServerProcess
from tests.waiting import wait_until

ANOTHER_ID = "--broker-id (a standalone: a --store namespace of its own, etcd://host:port/NS)"
"""The way out a refused duplicate names; a standalone has no --broker-id flag (its id is
always 'standalone'), so one started twice on a store is told what it can change."""

TTL_S = 10.0
"""The brokers' session TTL here, unless a test lets a session expire on purpose: long
enough that a busy machine does not expire one by itself (with 1 s, etcd granting 2 s, a CI
run on two loaded cores expired a session mid-test, and the broker registered again past
the moment the test was making)."""


def broker(
    store: MetadataStore, data_dir: Path, broker_id: str = "x1", *, ttl_s: float = TTL_S
) -> BrokerServer:
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    settings = BrokerSettings(
        broker_id=broker_id,
        advertise_url=f"http://127.0.0.1:{listener.port}",
        ledger_url=f"file://{data_dir}",
        session_ttl_s=ttl_s,
    )
    return BrokerServer(settings, store=store, listener=listener)


async def readyz(url: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as http, http.get(url + "/readyz") as response:
        return response.status, await response.json()


async def readyz_ok(url: str) -> bool:
    return (await readyz(url))[0] == 200


async def registered_url(store: MetadataStore, broker_id: str = "x1") -> str | None:
    return await Catalog(store).broker_url(broker_id)


async def test_a_second_broker_with_a_live_id_is_refused(
    store: MetadataStore, tmp_path: Path
) -> None:
    first = broker(store, tmp_path / "first")
    await first.start()
    try:
        async with Client(first.settings.advertise_url) as client:
            await client.admin.create_topic("persistent://acme/dup/a")
            producer = await client.create_producer("persistent://acme/dup/a")
            await producer.send(b"before")
            second = broker(store, tmp_path / "second")
            with pytest.raises(BrokerIdTaken) as refused:
                await second.start()
            await second.stop()
            assert str(refused.value) == (
                f"broker id x1 is already registered by a live broker at "
                f"{first.settings.advertise_url} "
                f"(session {first.service.session().lease_id:#x}); stop it first, or "
                f"start this one with another {ANOTHER_ID}"
            )
            assert await registered_url(store) == first.settings.advertise_url
            assert (await readyz(first.settings.advertise_url))[0] == 200
            await producer.send(b"after")  # the first one still serves
    finally:
        await first.stop()


async def test_a_crashed_brokers_id_is_taken_once_its_session_expires(
    store: MetadataStore, faults: FaultInjector, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker that could neither refresh nor revoke its session (as if killed): its
    record outlives it until the TTL; the same id then starts, without being refused."""
    crashed = broker(store, tmp_path / "x1", ttl_s=3.0)  # outlives the stop below
    await crashed.start()
    ttl = crashed.service.session().ttl_s
    faults.fail("lease_keepalive", times=None)
    faults.fail("lease_revoke", times=None)
    await crashed.stop()
    faults.clear()
    assert await registered_url(store) == crashed.settings.advertise_url  # left behind

    caplog.set_level(logging.INFO, logger="segtxn.broker.registration")
    restarted = broker(store, tmp_path / "x1", ttl_s=3.0)
    loop_time = asyncio.get_running_loop().time
    began = loop_time()
    try:
        await restarted.start()
        assert loop_time() - began < grace_s(ttl) + 5  # not refused: no more than the wait
        assert await registered_url(store) == restarted.settings.advertise_url
        waits = [r for r in caplog.records if "waiting up to" in r.getMessage()]
        assert len(waits) == 1 and waits[0].levelno == logging.WARNING
    finally:
        await restarted.stop()


async def test_a_deleted_registration_is_noticed_and_made_again(
    store: MetadataStore, faults: FaultInjector, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    live = broker(store, tmp_path / "x1")
    await live.start()
    url = live.settings.advertise_url
    try:
        # Park both the delete and the broker's claim after it, to see it not ready.
        writes = faults.hold("txn", key_prefix="/brokers/", times=2, before=True)
        deleting = asyncio.create_task(store.delete(broker_key("x1")))
        await writes.wait_for(1)
        writes.release(0)
        await deleting
        await writes.wait_for(2)  # the broker claims its id again
        status, body = await readyz(url)
        assert status == 503
        assert body["reason"] == "its registration /brokers/x1 was deleted"
        assert await registered_url(store) is None
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert any("was deleted; not ready" in r.getMessage() for r in warnings)
        writes.release(1)
        await wait_until(lambda: readyz_ok(url), what="ready again")
        assert await registered_url(store) == url
    finally:
        await live.stop()


async def test_an_id_taken_behind_a_live_brokers_back_keeps_it_not_ready(
    store: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another live session writes over the record: the broker says so at ERROR and is
    not ready; when that session ends, the broker registers again."""
    live = broker(store, tmp_path / "x1")
    await live.start()
    url = live.settings.advertise_url
    other = await store.open_session(TTL_S)
    try:
        squatter = b'{"broker_id": "x1", "url": "http://elsewhere:1", "started_ms": 0}'
        await store.put(broker_key("x1"), squatter, session=other)

        async def says_taken() -> bool:
            status, body = await readyz(url)
            return status == 503 and "registered by http://elsewhere:1" in str(body["reason"])

        await wait_until(says_taken, what="not ready, saying who holds the id")
        await wait_until(
            lambda: any(
                r.levelno == logging.ERROR
                and "registered by another broker, http://elsewhere:1" in r.getMessage()
                for r in caplog.records
            ),
            what="an ERROR naming the holder",
        )
        await other.close()  # the other holder goes: the id is free
        await wait_until(lambda: readyz_ok(url), what="ready again")
        assert await registered_url(store) == url
    finally:
        await other.close()
        await live.stop()


async def test_an_undrain_while_the_id_is_taken_stops_the_drain_and_says_so(
    store: MetadataStore, tmp_path: Path
) -> None:
    """A running broker that lost its registration keeps its drain mark, and registers again
    with it. An undrain sent to it meanwhile (no other broker can send one there: its URL is
    not registered) clears the mark, and it registers again undrained; the answer, a 503
    (retried: it says so once the broker is registered), said only that the broker was not
    registered, as if the undrain had failed."""
    live = broker(store, tmp_path / "x1")
    await live.start()
    url = live.settings.advertise_url
    other = await store.open_session(TTL_S)
    try:
        await live.service.set_draining(True)
        squatter = b'{"broker_id": "x1", "url": "http://elsewhere:1", "started_ms": 0}'
        await store.put(broker_key("x1"), squatter, session=other)

        async def lost() -> bool:
            return (await readyz(url))[0] == 503

        await wait_until(lost, what="the broker not registered")
        async with (
            aiohttp.ClientSession() as http,
            http.delete(f"{url}/admin/v2/brokers/x1/drain") as response,
        ):
            assert response.status == 503
            body = await response.json()
        assert body["error"] == "ServiceNotReady"
        assert body["message"].startswith("broker x1 is not registered now: ")
        assert "http://elsewhere:1" in body["message"]  # (why: its trouble, whose words vary)
        assert body["message"].endswith(
            "; its drain is stopped all the same: it registers again undrained"
        )
        await other.close()  # the id is free: the broker registers again
        await wait_until(lambda: readyz_ok(url), what="registered again")
        _, info, _ = await Catalog(store).broker_record("x1")
        assert info is not None and not info.draining
    finally:
        await other.close()
        await live.stop()


# ---------------------------------------------------------------------- real processes


@pytest.fixture
def store_url(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"/reg-procs-{os.getpid()}-{uuid.uuid4().hex[:8]}")


async def test_the_cli_refuses_a_duplicate_broker_id(
    store_url: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    first = processes.broker(store_url, tmp_path / "d1", "x1", session_ttl=2)
    started.append(first)
    first.start()
    await first.ready()
    duplicate = processes.broker(
        store_url, tmp_path / "d2", "x1", session_ttl=2, log=tmp_path / "dup.log"
    )
    started.append(duplicate)
    duplicate.start()
    proc = duplicate.proc
    assert proc is not None
    await wait_until(lambda: proc.poll() is not None, timeout=30, what="refused")
    assert proc.returncode == 1
    assert (
        f"broker id x1 is already registered by a live broker at {first.url} (session "
        in duplicate.log_text()
    )
    assert f"stop it first, or start this one with another {ANOTHER_ID}" in duplicate.log_text()
    await first.ready(limit_s=1)  # unaffected
    async with open_store(store_url) as meta:
        assert await registered_url(meta) == first.url


async def hold_lease(
    store: MetadataStore,
    lease_id: int,
    until: Callable[[], bool],
    *,
    every_s: float,
    limit_s: float,
) -> None:
    """Keep the lease ``lease_id`` (a killed process's) alive, renewing it every ``every_s``,
    until ``until()`` holds, checked before each renewal: no renewal is sent once it has been
    seen to hold, so from then on the lease lives at most one TTL more (plus one renewal's
    latency), as it would had its holder died then.

    Raises:
        AssertionError: the lease was gone, or ``until()`` did not hold within ``limit_s``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not until():
        assert loop.time() < deadline, f"not so within {limit_s} s"
        assert await store.engine.lease_keepalive(lease_id) > 0, f"lease {lease_id:#x} gone"
        with contextlib.suppress(AssertionError):  # (wait_until's time-out: renew again)
            await wait_until(until, timeout=every_s)


async def test_a_sigkilled_broker_restarts_with_its_id(
    store_url: str, tmp_path: Path, started: list[ServerProcess]
) -> None:
    """Restarted at once, the broker finds its old registration (its killed session's) and
    waits for it to go, then takes its id. The test holds the killed session's lease until
    the restarted process says it waits: a process start-up on a loaded machine took longer
    than the TTL, the registration had expired already, and there was nothing to wait for."""
    ttl = 6.0
    server = processes.broker(
        store_url, tmp_path / "d1", "x1", session_ttl=ttl, log=tmp_path / "x1.log"
    )
    started.append(server)
    server.start()
    await server.ready()
    server.kill()
    async with open_store(store_url) as meta:
        record, info, _ = await Catalog(meta).broker_record("x1")
        assert record is not None and info is not None and info.url == server.url  # left behind
        server.start()  # at once
        await hold_lease(
            meta,
            record.session_id,
            lambda: "waiting up to" in server.log_text(),
            every_s=ttl / 3,
            limit_s=60,  # a process start-up on a loaded machine
        )
    await server.ready(limit_s=grace_s(ttl) + 15)  # the wait, then the rest of a start-up
    assert "already registered" not in server.log_text()


async def test_a_refusal_while_the_registration_is_read_again_does_not_end_its_watch(
    store: MetadataStore, faults: FaultInjector, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The history the registration's watch would resume from is compacted, and reading the
    record again is refused once (``StoreAccessDenied``: a permission taken away and given
    back). The watch goes on: a deletion of the record later is still noticed. The refusal
    ended the watch for good (only ``StoreUnavailable`` was retried), so the broker never
    noticed its registration go."""
    watching = faults.count("watch", key_prefix=broker_key("x1"))
    live = broker(store, tmp_path / "x1")
    await live.start()
    url = live.settings.advertise_url
    try:
        await wait_until(lambda: watching.calls >= 1, what="the registration watching")
        faults.fail("watch", key_prefix="/brokers/", times=None)
        assert faults.drop_watches() >= 1
        for i in range(3):
            await store.put(f"/unrelated/{i}", b"x")
        await store.compact(await store.revision())
        injected = faults.injected
        faults.clear()  # the watch may resume (and meets the compaction) once this yields:
        refusal = StoreAccessDenied("injected refusal")  # its read of the record is refused
        faults.fail("range", key_prefix=broker_key("x1"), error=refusal)
        await wait_until(lambda: faults.injected > injected, what="the refused read again")
        await store.delete(broker_key("x1"))
        await wait_until(
            lambda: "was deleted; not ready" in caplog.text, what="the deletion noticed"
        )
        await wait_until(lambda: readyz_ok(url), what="registered again")
        assert await registered_url(store) == url
    finally:
        await live.stop()
