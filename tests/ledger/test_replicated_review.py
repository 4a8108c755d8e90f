"""Replicated ledgers: cases found in the review of issue 17 (fencing, the wire's edge).

Same harness as tests/ledger/test_replicated.py: real nodes on real files behind real
aiohttp servers, managed ledgers on the in-memory store.
"""

from __future__ import annotations

import contextlib

import pytest
from aiohttp import web

from segtxn.ledger import LedgerError, ManagedLedger
from segtxn.ledger.replicas import HttpReplica, Member, ReplicaUnavailable
from segtxn.metastore import MetadataStore
from tests.ledger.replicas import TIMEOUT_S, Cluster, payloads_of

NAME = "persistent://t/n/replicated"


async def test_a_replica_that_lost_its_file_does_not_vouch_for_an_empty_ledger(
    store: MetadataStore, cluster: Cluster
) -> None:
    """A replica in a ledger's placement was created there (the metadata names it only
    after its create succeeded), so one whose file is gone lost data: its fence must not
    answer "0 entries" (BookKeeper's #2908 made the same mistake with NoSuchLedger). Here
    the ledger went on b0 and b1 (b2 was down), so one fenced answer is enough for its
    recovery: b1's empty answer closed the ledger at 0, silently dropping 5 entries both
    replicas had acknowledged."""
    for _ in range(3):
        await cluster.add()
    await cluster.stop(2)
    writer = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    for i in range(5):
        await writer.append(f"k{i}".encode())
    ledger_id = writer.ledger_ids[-1]
    # the writer's broker goes away (no clean close), and b1 loses the replica's file
    await cluster.stop(0)
    cluster.servers[1].node.delete(NAME, ledger_id)
    await cluster.start(2)

    sent = [f"k{i}".encode() for i in range(5)]
    try:
        try:
            reader = await ManagedLedger.open(NAME, store, cluster.storage(2, write=3, ack=2))
        except LedgerError:
            pass  # refusing (too few replicas can vouch for it) is right; b0 may come back
        else:
            stored = await payloads_of(reader)
            await reader.close()
            assert stored == sent, "acknowledged entries lost"
        await cluster.start(0)  # once b0 is back, its copy recovers the ledger whole
        reader = await ManagedLedger.open(NAME, store, cluster.storage(2, write=3, ack=2))
        assert await payloads_of(reader) == sent
        await reader.close()
    finally:
        if cluster.servers[0].runner is None:
            await cluster.start(0)  # (so the writer's close can reach its node)
        with pytest.raises(LedgerError):
            await writer.close()


@pytest.mark.parametrize(
    "query",
    [
        {"ledger": NAME, "id": "\u00b2"},  # str.isdigit() holds for a superscript two
        {"ledger": NAME, "id": "1", "first": "\u00b9"},
        {"ledger": "..", "id": "1"},  # quote("..") is "..": the node's root's parent
        {"ledger": ".", "id": "1"},  # (a file in the root, outside any ledger's directory)
        {"ledger": "\u00e9" * 50, "id": "1"},  # quoted, 300 bytes: over a file name's 255
        {"ledger": NAME, "id": "1", "recovery": "true"},  # was read as 0, silently
        {"ledger": NAME, "id": "1", "recovery": "yes"},
    ],
)
async def test_bad_names_and_numbers_get_a_400_and_touch_no_file(
    cluster: Cluster, query: dict[str, str]
) -> None:
    server = await cluster.add()
    before = sorted(p for p in server.root.parent.rglob("*"))
    params = {"instance": server.node.instance, "first": "0", "recovery": "1", **query}
    async with cluster.session.post(
        f"{server.url}/replica/v1/append", params=params, data=b"\x00\x00\x00\x01x"
    ) as response:
        assert response.status == 400
        assert (await response.json())["error"] == "InvalidArgument"
    assert sorted(p for p in server.root.parent.rglob("*")) == before


@pytest.mark.parametrize(
    ("op", "body"),
    [
        ("fence", b"{}"),
        ("fence", b"[1, 2]"),
        ("fence", b'{"count": "many", "size": 1}'),
        ("append", b"not json"),
        ("append", b'{"count": null}'),
    ],
)
async def test_a_node_answering_garbage_is_unavailable_not_a_crash(
    cluster: Cluster, op: str, body: bytes
) -> None:
    """The wire's contract: "any other answer is ReplicaUnavailable". A KeyError or a
    ValueError instead escapes the ``except LedgerError`` of recovery's copies and of
    ``_replace``, so one bad node failed a whole recovery instead of being skipped."""

    async def garbage(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/replica/v1/{op}", garbage)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"

    async def locate(broker: str) -> str | None:
        return url

    replica = HttpReplica(Member("bad", "x"), locate, cluster.session, timeout_s=TIMEOUT_S)
    try:
        with pytest.raises(ReplicaUnavailable):
            if op == "fence":
                await replica.fence(NAME, 1)
            else:
                await replica.append(NAME, 1, 0, [b"x"], recovery=True)
    finally:
        await runner.cleanup()


async def test_the_replaced_owner_cannot_fence_the_new_owners_cursor(
    store: MetadataStore, cluster: Cluster
) -> None:
    """After a take-over the old owner (paused past its session, not yet aware) still has
    its consumers, and their acks, and the cursor flush of its close when it lets go,
    are compare-and-sets on the cursor's version. The new owner restored that version
    when it opened the ledger, so the stale owner's save succeeds and every later ack
    at the new owner fails with LedgerFenced: the subscription cannot move on there
    until the topic is reloaded."""
    for _ in range(3):
        await cluster.add()
    old = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    positions = [await old.append(f"c{i}".encode()) for i in range(3)]
    old_cursor = await old.open_cursor("sub", start="earliest")

    new = await ManagedLedger.open(NAME, store, cluster.storage(1, write=3, ack=2))
    new_cursor = new.cursors["sub"]
    try:
        with contextlib.suppress(LedgerError):  # refusing it is right: it moved
            await old_cursor.ack([positions[0]])  # the stale owner's consumer
        await new_cursor.ack([positions[1]])  # must keep working where the topic lives now
    finally:
        with contextlib.suppress(LedgerError):
            await new.close()
        with contextlib.suppress(LedgerError):
            await old.close()
