"""The metadata store where it refuses or races, each failing before its fix (a review):
``delete_range`` racing a sequential put (its counter was reset under a surviving key), and
watches etcd refuses for permission (a retriable ``StoreUnavailable``, retried for ever
and said only at DEBUG), on a real etcd with TLS and authentication on, and a store user
given for an etcd without authentication (its "authentication is not enabled" retried
for ever).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from aetcd import rpc

from segtxn.metastore import (
    MetadataStore,
    StoreAccessDenied,
    StoreCredentials,
    StoreSettings,
    WatchEvent,
    open_store,
)
from segtxn.metastore import keys as K
from segtxn.metastore.etcd import EtcdEngine
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.metastore.faults import FaultInjector
from tests.auth.test_store_security import (
    PREFIX,
    SecureEtcd,
    _as_root,
    _permission,
    running_secure_etcd,
)
from tests.metastore.conftest import MakeStore
from tests.metastore.test_store_edges import _faults
from tests.waiting import wait_until

# ------------------------------------------- delete_range never resets a counter under a key


async def test_delete_range_keeps_the_counter_of_a_put_that_survives_it(
    make_store: MakeStore,
) -> None:
    """delete_range removed the records, then, in a second and unconditional step, the
    prefix's sequence counter. A sequential put between the two survived while its
    counter went, so the next sequential put was numbered 1: below the survivor."""
    writer, deleter = make_store(), make_store()
    for i in range(3):
        await writer.put("/sq/", f"{i}".encode(), sequential=True)
    # park the deleter once its records are gone, before it reads the counters
    parked = _faults(deleter).hold("range", key_prefix=K.SEQUENCE_ROOT, before=True)
    deleting = asyncio.create_task(deleter.delete_range("/sq/"), name="delete-range")
    await parked.wait_for(1)
    assert (await writer.list_prefix("/sq/")).records == []
    survivor = await writer.put("/sq/", b"late", sequential=True)
    parked.release()
    assert await deleting == 3

    later = await writer.put("/sq/", b"later", sequential=True)
    fresh = await make_store().put("/sq/", b"fresh", sequential=True)  # no cached counter
    keys = [r.key for r in (await writer.list_prefix("/sq/")).records]
    assert keys == [survivor.key, later.key, fresh.key], keys
    assert survivor.key < later.key < fresh.key


async def test_delete_range_of_an_idle_prefix_still_forgets_its_counter(
    make_store: MakeStore,
) -> None:
    """The documented reset holds for a prefix left empty, and for every client: another
    client's cached counter does not bring the old numbering back."""
    writer, deleter = make_store(), make_store()
    await writer.put("/idle/", b"1", sequential=True)
    await writer.put("/idle/", b"2", sequential=True)
    assert await deleter.delete_range("/idle/") == 2
    again = await writer.put("/idle/", b"3", sequential=True)
    assert again.key == K.sequential_key("/idle/", 1)
    counters = await deleter.engine.range(
        K.sequence_counter_key(b"/idle/"), K.sequence_counter_key(b"/idle0")
    )
    assert [kv.value for kv in counters.kvs] == [b"1"]


# ------------------------------------------------ a watch etcd refuses is StoreAccessDenied

WATCHER = "watcher"
"""A user of this module's etcd whose permission on PREFIX the tests take and give back."""


@pytest.fixture(scope="module")
def refusing_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEtcd]:
    """An etcd with TLS and authentication on (tests/auth/test_store_security.py), and
    WATCHER, with its own role and password."""
    directory = tmp_path_factory.mktemp("refusing-etcd")
    with running_secure_etcd(directory) as etcd:
        (directory / "watcher-password").write_text("watcher-password\n")
        users = [
            ("UserAdd", rpc.AuthUserAddRequest(name=WATCHER, password="watcher-password")),
            ("RoleAdd", rpc.AuthRoleAddRequest(name=WATCHER)),
            ("UserGrantRole", rpc.AuthUserGrantRoleRequest(user=WATCHER, role=WATCHER)),
        ]
        asyncio.run(_as_root(etcd.server, etcd.ca, directory, users))
        yield etcd


async def _permit(etcd: SecureEtcd, directory: Path, *, allowed: bool) -> None:
    """Give WATCHER read-write on PREFIX, or take it away."""
    change: tuple[str, object]
    if allowed:
        grant = rpc.AuthRoleGrantPermissionRequest(name=WATCHER, perm=_permission())
        change = ("RoleGrantPermission", grant)
    else:
        whole = {"key": PREFIX.encode(), "range_end": K.prefix_end(PREFIX.encode())}
        revoke = rpc.AuthRoleRevokePermissionRequest(role=WATCHER, **whole)
        change = ("RoleRevokePermission", revoke)
    await _as_root(etcd.server, etcd.ca, directory, [change])


@pytest.fixture
async def watcher(refusing_etcd: SecureEtcd, tmp_path: Path) -> AsyncIterator[MetadataStore]:
    """A store client as WATCHER (allowed on PREFIX while the test runs), its engine
    wrapped in a FaultInjector; its namespace is this test's own."""
    await _permit(refusing_etcd, tmp_path, allowed=True)
    credentials = refusing_etcd.credentials(
        user=WATCHER, password_file=refusing_etcd.directory / "watcher-password"
    )
    url = refusing_etcd.url(f"w-{os.urandom(4).hex()}")
    store = open_store(
        url, StoreSettings(watch_retry_max_s=0.2, credentials=credentials), wrap=FaultInjector
    )
    yield store
    await store.close()
    await _permit(refusing_etcd, tmp_path, allowed=True)


def _etcd(store: MetadataStore) -> EtcdEngine:
    engine = _faults(store).inner
    assert isinstance(engine, EtcdEngine)
    return engine


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING
        and ("StoreAccessDenied" in r.getMessage() or "access denied" in r.getMessage())
    ]


async def test_a_watch_refused_at_once_is_access_denied(
    watcher: MetadataStore, refusing_etcd: SecureEtcd, tmp_path: Path
) -> None:
    """etcd cancels a watch its user may not read with "permission denied": the watch
    raised StoreUnavailable, the class that says "try the same again", and the engine
    did not count it as a refusal (so /readyz said ready)."""
    await _permit(refusing_etcd, tmp_path, allowed=False)
    for watch in (
        watcher.watch("/k", from_revision=1),
        watcher.watch_prefix("/p/", from_revision=1),
    ):
        with pytest.raises(StoreAccessDenied, match="permission denied"):
            async with watch:
                pass
    assert isinstance(_etcd(watcher).denied, StoreAccessDenied)


async def test_a_watch_refused_while_it_resumes_says_why_and_goes_on(
    watcher: MetadataStore,
    refusing_etcd: SecureEtcd,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A watch whose stream broke and whose user lost the permission meanwhile: each
    attempt to resume was a StoreUnavailable logged at DEBUG after the first WARNING
    (which named the break, not the refusal), so nothing said why nothing arrived. The
    refusal is now said at WARNING, as StoreAccessDenied, and the watch goes on once the
    permission is back (nothing missed)."""
    caplog.set_level(logging.DEBUG, logger="segtxn.metastore")
    start = await watcher.revision() + 1
    heard: list[str] = []

    async def follow(events: AsyncIterator[WatchEvent]) -> None:
        async for event in events:
            heard.append(event.key)

    async with watcher.watch_prefix("/r/", from_revision=start) as events:
        following = asyncio.create_task(follow(events), name="follow-r")
        try:
            await watcher.put("/r/1", b"1")
            await wait_until(lambda: heard == ["/r/1"], what="the first event")
            await _permit(refusing_etcd, tmp_path, allowed=False)
            caplog.clear()
            assert _faults(watcher).drop_watches() == 1
            await wait_until(lambda: bool(_refusals(caplog)), what="the refusal logged")
            assert isinstance(_etcd(watcher).denied, StoreAccessDenied)
            await _permit(refusing_etcd, tmp_path, allowed=True)
            await watcher.put("/r/2", b"2")
            await wait_until(lambda: heard == ["/r/1", "/r/2"], what="the change once allowed")
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
    assert any("permission denied" in m for m in _refusals(caplog))


async def test_point_watches_refused_while_they_resume_say_so_and_go_on(
    watcher: MetadataStore,
    refusing_etcd: SecureEtcd,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The point watch stream survives a refusal while it reopens (an earlier fix), but
    etcd's "permission denied" cancel of a watch was a StoreUnavailable: the engine did not
    count it as a refusal (/readyz said ready) and the log said the stream broke."""
    heard: list[WatchEvent] = []
    points = watcher.point_watches(heard.append, lambda key: None)
    await points.start()
    try:
        points.add("/pw/a", await watcher.revision() + 1)
        await watcher.put("/pw/a", b"1")
        await wait_until(lambda: len(heard) == 1, what="the first event")
        await _permit(refusing_etcd, tmp_path, allowed=False)
        caplog.clear()
        assert _faults(watcher).drop_watches() == 1
        await wait_until(lambda: bool(_refusals(caplog)), what="the refusal logged")
        assert isinstance(_etcd(watcher).denied, StoreAccessDenied)
        await _permit(refusing_etcd, tmp_path, allowed=True)
        await watcher.put("/pw/a", b"2")
        await wait_until(lambda: len(heard) == 2, what="the change once allowed again")
    finally:
        await points.close()


# ------------------------------------------- a user given for an etcd without authentication


def _unused_user(tmp_path: Path) -> StoreCredentials:
    (tmp_path / "password").write_text("a-password\n")
    return StoreCredentials(user="segtxn", password_file=tmp_path / "password")


def _unused(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and "authentication is not enabled" in r.getMessage()
    ]


async def test_a_user_for_an_etcd_without_authentication_goes_on_without_a_token(
    etcd_server: EtcdServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd answers Authenticate with "authentication is not enabled" when its
    authentication is off; the engine took that for an outage (StoreUnavailable), so every
    call failed and a server retried until its --store-timeout. etcdctl --user goes on
    without a token there: so does the store, saying once that the user is not used."""
    url = etcd_server.url(f"/unused-user-{os.getpid()}-{os.urandom(4).hex()}")
    settings = StoreSettings(request_timeout_s=2.0, credentials=_unused_user(tmp_path))
    async with open_store(url, settings) as store:
        start = await store.revision() + 1
        async with store.watch("/k", from_revision=start) as events:
            await store.put("/k", b"v")
            assert (await anext(events)).key == "/k"
        record = await store.get("/k")
        assert record is not None and record.value == b"v"
        assert store.engine.denied is None
    warned = _unused(caplog)
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "segtxn" in warned[0].getMessage()


async def test_authentication_turned_on_later_is_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client given a user before its etcd's authentication is turned on (credentials
    first, then ``etcdctl auth enable``) authenticates once etcd wants it: going on
    without a token must not stick once etcd refuses calls without one, a call's or a
    watch's as it resumes (neither is a refusal of the user: nothing is denied)."""
    server = EtcdServer.in_temp_dir(unsafe_no_fsync=True)
    server.start()
    heard: list[bytes] = []

    async def follow(events: AsyncIterator[WatchEvent]) -> None:
        async for event in events:
            heard.append(event.record.value if event.record else b"")

    try:
        settings = StoreSettings(
            request_timeout_s=2.0, watch_retry_max_s=0.2, credentials=_unused_user(tmp_path)
        )
        async with open_store(server.url("/segtxn"), settings, wrap=FaultInjector) as store:
            start = await store.revision() + 1
            async with store.watch("/k", from_revision=start) as events:
                following = asyncio.create_task(follow(events), name="follow-k")
                try:
                    await store.put("/k", b"before")
                    assert len(_unused(caplog)) == 1
                    await wait_until(lambda: heard == [b"before"], what="the first event")
                    await _turn_authentication_on(server)
                    caplog.set_level(logging.DEBUG, logger="segtxn.metastore")
                    assert _faults(store).drop_watches() == 1  # resumes: refused, made again
                    await wait_until(
                        lambda: any(
                            "refused a call without" in r.getMessage() for r in caplog.records
                        ),
                        what="the watch refused without a token",
                    )
                    await store.put("/k", b"after")  # refused without a token, made again
                    await store.put("/k", b"again")
                    await wait_until(lambda: heard == [b"before", b"after", b"again"])
                finally:
                    following.cancel()
                    await asyncio.gather(following, return_exceptions=True)
            assert _etcd(store).denied is None
            assert not [r for r in caplog.records if "access denied" in r.getMessage()]
    finally:
        server.stop()


async def _turn_authentication_on(server: EtcdServer) -> None:
    """root, and the user "segtxn" (read-write on /segtxn), then authentication on."""
    async with grpc.aio.insecure_channel(server.endpoint) as channel:
        auth = rpc.AuthStub(channel)
        for user, password in (("root", "root-password"), ("segtxn", "a-password")):
            await auth.UserAdd(rpc.AuthUserAddRequest(name=user, password=password))
            await auth.RoleAdd(rpc.AuthRoleAddRequest(name=user))
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=user, role=user))
        grant = rpc.AuthRoleGrantPermissionRequest(name="segtxn", perm=_permission())
        await auth.RoleGrantPermission(grant)
        await auth.AuthEnable(rpc.AuthEnableRequest())
