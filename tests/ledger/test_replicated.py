"""Replicated ledgers: quorum writes, fencing, recovery, lost and wiped storage nodes.

Every node is a real ``ReplicaNode`` on real files behind a real aiohttp server
(tests/ledger/replicas.py); managed ledgers run on the in-memory metadata store.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from segtxn.ledger import LedgerError, LedgerSettings, ManagedLedger, Position
from segtxn.ledger.errors import LedgerFenced, LedgerMissing, NotEnoughReplicas, WriteFailed
from segtxn.ledger.managed import metadata_key
from segtxn.ledger.metadata import decode
from segtxn.ledger.replicas import (
    HttpReplica,
    Member,
    ReplicaFenced,
    ReplicaGap,
    ReplicaNode,
    ReplicaUnavailable,
)
from segtxn.ledger.replicas import node as node_module
from segtxn.ledger.replicas import quorum as quorum_module
from segtxn.ledger.replicas.wire import encode_frames
from segtxn.metastore import MetadataStore
from tests.ledger.replicas import TIMEOUT_S, Cluster, payloads_of, placement_members, started
from tests.waiting import wait_until

NAME = "persistent://t/n/replicated"
TINY_LIMIT = 1000


async def ledgers_of(store: MetadataStore) -> list[list[str]]:
    """Each ledger's replicas (brokers), oldest first."""
    record = await store.get(metadata_key(NAME))
    assert record is not None
    return [placement_members(i.replicas) for i in decode(record.value).ledgers]


async def test_appends_reach_every_replica_and_read_back(
    store: MetadataStore, cluster: Cluster
) -> None:
    await started(cluster, 3)
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await ManagedLedger.open(NAME, store, storage)
    sent = [f"m{i}".encode() for i in range(50)]
    await asyncio.gather(*(ledger.append(p) for p in sent))
    assert await payloads_of(ledger) == sent
    (replicas,) = await ledgers_of(store)
    assert replicas[0] == "b0" and sorted(replicas) == ["b0", "b1", "b2"]  # local first
    await ledger.close()
    ledger_id = ledger.ledger_ids[-1]
    assert [cluster.holds(i, NAME, ledger_id) for i in range(3)] == [50, 50, 50]


async def test_a_new_owner_fences_the_old_writer_and_keeps_every_acknowledged_entry(
    store: MetadataStore, cluster: Cluster
) -> None:
    await started(cluster, 3)
    old = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    acknowledged = [await old.append(f"a{i}".encode()) for i in range(20)]
    assert acknowledged[-1] == Position(1, 19)

    new = await ManagedLedger.open(NAME, store, cluster.storage(1, write=3, ack=2))
    assert await payloads_of(new) == [f"a{i}".encode() for i in range(20)]

    with pytest.raises(LedgerError, match="recovered by another owner"):
        await old.append(b"too late")
    assert b"too late" not in await payloads_of(new)
    await new.append(b"after")
    assert (await payloads_of(new))[-1] == b"after"
    assert (await ledgers_of(store))[-1][0] == "b1"  # the new owner's ledger starts on it
    await old.close()
    await new.close()


async def test_a_replica_that_dies_leaves_the_ensemble_and_the_next_ledger_avoids_it(
    store: MetadataStore, cluster: Cluster
) -> None:
    await started(cluster, 4)
    storage = cluster.storage(0, write=3, ack=2)
    ledger = await ManagedLedger.open(NAME, store, storage)
    (first,) = await ledgers_of(store)
    await ledger.append(b"before")
    victim = next(int(b[1:]) for b in first if b != "b0")
    await cluster.stop(victim)
    for i in range(5):  # the first of these drops the victim; the next roll over
        await ledger.append(f"after{i}".encode())
    replicas = await ledgers_of(store)
    assert len(replicas) >= 2
    assert f"b{victim}" not in replicas[-1] and len(replicas[-1]) == 3
    assert await payloads_of(ledger) == [b"before"] + [f"after{i}".encode() for i in range(5)]
    await ledger.close()


async def test_without_a_quorum_an_append_fails_with_a_retriable_error_not_a_hang(
    store: MetadataStore, cluster: Cluster
) -> None:
    await started(cluster, 3)
    ledger = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    await ledger.append(b"ok")
    await cluster.stop(1)
    await cluster.stop(2)
    failures: list[WriteFailed] = []
    ledger.on_write_failure.append(failures.append)
    with pytest.raises(WriteFailed) as raised:
        await asyncio.wait_for(ledger.append(b"lost"), 4 * TIMEOUT_S)
    assert "needs at least 2 storage nodes" in str(raised.value)
    assert raised.value.retriable  # the broker tells the producer to try again
    assert isinstance(raised.value.cause, NotEnoughReplicas)
    assert [f.cause for f in failures] == [raised.value.cause]  # its owner is told, once
    with pytest.raises(WriteFailed) as again:
        await ledger.append(b"later")
    assert again.value.retriable
    await ledger.close()


async def test_a_ledger_goes_on_fewer_nodes_when_too_few_are_alive_but_never_below_the_quorum(
    store: MetadataStore, cluster: Cluster
) -> None:
    await started(cluster, 2)
    await cluster.stop(1)
    with pytest.raises(NotEnoughReplicas, match="needs at least 2 storage nodes"):
        await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    assert await store.get(metadata_key(NAME)) is None
    await cluster.start(1)
    ledger = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    assert await ledgers_of(store) == [["b0", "b1"]]
    await ledger.append(b"on two")
    await ledger.close()


async def test_recovery_ends_at_the_longest_fenced_replica_and_copies_it_to_the_others(
    store: MetadataStore, cluster: Cluster
) -> None:
    """An entry that only one replica got (its writer never heard back) is kept, and
    after recovery a quorum holds every entry up to the end."""
    await started(cluster, 3)
    writer = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    for i in range(10):
        await writer.append(f"e{i}".encode())
    ledger_id = writer.ledger_ids[-1]
    await wait_until(  # (an entry needs two replicas: the third may still be catching up)
        lambda: [cluster.holds(i, NAME, ledger_id) for i in range(3)] == [10, 10, 10]
    )
    # b0 takes two entries the writer never got acknowledged (its writer then dies)
    cluster.servers[0].node.append(NAME, ledger_id, 10, [b"e10", b"e11"], False)
    assert [cluster.holds(i, NAME, ledger_id) for i in range(3)] == [12, 10, 10]

    recovered = await ManagedLedger.open(NAME, store, cluster.storage(2, write=3, ack=2))
    assert await payloads_of(recovered) == [f"e{i}".encode() for i in range(12)]
    assert [cluster.holds(i, NAME, ledger_id) for i in range(3)] == [12, 12, 12]
    await recovered.close()
    with pytest.raises(LedgerFenced):  # the replaced writer cannot record a clean close
        await writer.close()


async def test_recovery_needs_enough_replicas_fenced(
    store: MetadataStore, cluster: Cluster
) -> None:
    await started(cluster, 3)
    writer = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    await writer.append(b"x")
    await cluster.stop(1)
    await cluster.stop(2)
    with pytest.raises(NotEnoughReplicas, match="needs 2 of its 3 replicas fenced; 1 answered"):
        await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    await cluster.start(1)
    await cluster.start(2)  # (the next ledger needs all three again)
    recovered = await ManagedLedger.open(NAME, store, cluster.storage(1, write=3, ack=2))
    assert await payloads_of(recovered) == [b"x"]
    await recovered.close()
    with pytest.raises(LedgerFenced):
        await writer.close()


async def test_a_wiped_node_is_a_new_instance_and_reads_go_to_the_others(
    store: MetadataStore, cluster: Cluster
) -> None:
    await started(cluster, 3)
    writer = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    for i in range(5):
        await writer.append(f"w{i}".encode())
    await writer.close()
    old_member = cluster.servers[1].member
    await cluster.restart(1, wipe=True)
    assert cluster.servers[1].member != old_member
    replica = cluster.nodes(0).replica(old_member)
    with pytest.raises(ReplicaUnavailable, match=r"not .*: it was emptied or replaced"):
        await replica.read(NAME, 1, 0, 0)

    reader = await ManagedLedger.open(NAME, store, cluster.storage(2, write=3, ack=2))
    assert await payloads_of(reader) == [f"w{i}".encode() for i in range(5)]
    await reader.close()


def test_a_fence_survives_a_node_restart(tmp_path: Path) -> None:
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    node.create(NAME, 1)
    assert node.append(NAME, 1, 0, [b"a"], False) == 1
    count, size = node.fence(NAME, 1)
    assert count == 1 and size > 0
    node.close()
    again = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    assert again.instance == node.instance
    with pytest.raises(ReplicaFenced):
        again.append(NAME, 1, 1, [b"b"], False)
    assert again.append(NAME, 1, 1, [b"b"], True) == 2  # a recovery's copy passes
    with pytest.raises(LedgerMissing):  # a ledger this node never got vouches for nothing,
        again.fence(NAME, 2)  # but is fenced too,
    with pytest.raises(ReplicaFenced):
        again.create(NAME, 2)  # so its old writer's late create cannot land here
    again.close()


def test_a_replica_holds_a_prefix_only(tmp_path: Path) -> None:
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    node.create(NAME, 1)
    node.append(NAME, 1, 0, [b"a", b"b"], False)
    with pytest.raises(ReplicaGap) as gap:
        node.append(NAME, 1, 3, [b"d"], False)
    assert gap.value.count == 2
    with pytest.raises(ReplicaGap):
        node.append(NAME, 1, 1, [b"b"], False)  # a normal append never overlaps
    assert node.append(NAME, 1, 1, [b"b", b"c"], True) == 3  # a recovery's overlap is skipped
    assert node.read(NAME, 1, 0, 2) == [b"a", b"b", b"c"]
    node.close()


def test_a_root_with_replicas_but_no_identity_is_refused(tmp_path: Path) -> None:
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    node.create(NAME, 1)
    node.close()
    (tmp_path / ".instance").unlink()
    with pytest.raises(LedgerError, match=r"no \.instance file"):
        ReplicaNode(tmp_path, tail_bytes=1 << 20)


BAD = "InvalidArgument"
ONE = {"ledger": NAME, "id": "1"}


@pytest.mark.parametrize(
    ("op", "query", "body", "status", "error"),
    [
        ("append", {**ONE, "first": "0"}, b"\x00\x00\x00\x09ab", 400, BAD),
        ("append", {**ONE, "first": "0"}, b"\x00" * (TINY_LIMIT + 1), 400, BAD),
        ("append", {"ledger": NAME, "id": "0", "first": "0"}, b"", 400, BAD),
        ("read", {**ONE, "ledger": "", "first": "0", "last": "0"}, b"", 400, BAD),
        ("read", {**ONE, "first": "5", "last": "1"}, b"", 400, BAD),
        ("read", {**ONE, "first": "x", "last": "1"}, b"", 400, BAD),
        ("read", {**ONE, "first": "0", "last": "99999"}, b"", 400, BAD),
        ("read", {**ONE, "id": "7", "first": "0", "last": "0"}, b"", 404, "Missing"),
        ("read", {**ONE, "first": "3", "last": "3"}, b"", 416, "Behind"),
        ("append", {**ONE, "first": "4"}, encode_frames([b"x"]), 409, "Gap"),
        ("create", {**ONE, "instance": "0123"}, b"", 410, "WrongInstance"),
    ],
)
async def test_bad_requests_get_a_named_error_and_change_nothing(
    cluster: Cluster, op: str, query: dict[str, str], body: bytes, *, status: int, error: str
) -> None:
    server = (await started(cluster, 1)).servers[0]
    server.node.max_request_bytes = TINY_LIMIT
    server.node.create(NAME, 1)
    server.node.append(NAME, 1, 0, [b"a"], False)
    params = {"instance": server.node.instance, **query}
    async with cluster.session.post(
        f"{server.url}/replica/v1/{op}", params=params, data=body
    ) as response:
        assert response.status == status
        assert (await response.json())["error"] == error
    assert cluster.holds(0, NAME, 1) == 1


async def test_the_client_names_the_errors_it_gets(cluster: Cluster) -> None:
    server = (await started(cluster, 1)).servers[0]

    async def locate(broker: str) -> str | None:
        return server.url

    replica = HttpReplica(server.member, locate, cluster.session, timeout_s=TIMEOUT_S)
    await replica.create(NAME, 1)
    assert await replica.append(NAME, 1, 0, [b"a", b""], recovery=False) == 2
    assert await replica.read(NAME, 1, 0, 1) == [b"a", b""]
    with pytest.raises(ReplicaGap):
        await replica.append(NAME, 1, 5, [b"x"], recovery=False)
    assert await replica.fence(NAME, 1) == (2, server.node.fence(NAME, 1)[1])
    with pytest.raises(LedgerFenced):
        await replica.append(NAME, 1, 2, [b"x"], recovery=False)
    await cluster.stop(0)
    with pytest.raises(ReplicaUnavailable):
        await replica.read(NAME, 1, 0, 0)
    gone = HttpReplica(Member("nobody", "x"), _nowhere, cluster.session, timeout_s=TIMEOUT_S)
    with pytest.raises(ReplicaUnavailable, match="not registered"):
        await gone.delete(NAME, 1)


async def _nowhere(broker: str) -> str | None:
    return None


@pytest.mark.parametrize(("write", "ack"), [(3, 3), (4, 3), (2, 0), (1, 2)])
async def test_quorums_recovery_cannot_work_with_are_refused(
    cluster: Cluster, write: int, ack: int
) -> None:
    await cluster.add()
    with pytest.raises(ValueError, match="2A <= W"):
        cluster.storage(0, write=write, ack=ack)


async def test_settings_cover_a_single_node(store: MetadataStore, cluster: Cluster) -> None:
    await started(cluster, 1)
    ledger = await ManagedLedger.open(
        NAME, store, cluster.storage(0, write=1, ack=1), LedgerSettings(max_ledger_bytes=200)
    )
    for i in range(20):  # several rollovers
        await ledger.append(f"{i:030d}".encode())
    await ledger.close()
    again = await ManagedLedger.open(NAME, store, cluster.storage(0, write=1, ack=1))
    assert len(await payloads_of(again)) == 20
    await again.close()


async def test_a_takeover_during_appends_keeps_every_acknowledged_entry_in_order(
    store: MetadataStore, cluster: Cluster
) -> None:
    """The old writer keeps appending (several in flight) while another opens the
    ledger: everything acknowledged to the old writer is in the new owner's ledger, in
    order, once; and the old writer gets nothing more acknowledged after the takeover."""
    await started(cluster, 3)
    old = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    acknowledged: list[bytes] = []
    enough = asyncio.Event()

    async def write(lane: int) -> None:
        i = 0
        while True:
            payload = f"{lane}-{i}".encode()
            try:
                await old.append(payload)
            except LedgerError:
                return
            acknowledged.append(payload)
            if len(acknowledged) >= 40:
                enough.set()
            i += 1

    lanes = [asyncio.create_task(write(lane)) for lane in range(4)]
    await asyncio.wait_for(enough.wait(), 30)
    new = await ManagedLedger.open(NAME, store, cluster.storage(1, write=3, ack=2))
    taken_over_at = len(acknowledged)
    await asyncio.wait_for(asyncio.gather(*lanes), 30)
    stored = await payloads_of(new)
    assert len(stored) == len(set(stored))
    assert set(acknowledged) <= set(stored)
    for lane in range(4):  # each lane's order holds
        mine = [p for p in stored if p.startswith(f"{lane}-".encode())]
        assert mine == sorted(mine, key=lambda p: int(p.split(b"-")[1]))
    # at most the batch in flight at the takeover was acknowledged after it
    assert len(acknowledged) - taken_over_at <= 4
    await new.close()
    await old.close()


async def test_reads_and_recovery_copies_come_in_bounded_pieces(
    store: MetadataStore, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node answers a read with at most READ_BYTES (one entry at least), and readers
    and recovery's copies go on from where an answer ended."""
    monkeypatch.setattr(node_module, "READ_BYTES", 3000)
    await started(cluster, 3)
    writer = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    sent = [bytes([i]) * 1000 for i in range(12)] + [b"big" * 2000]
    for payload in sent:
        await writer.append(payload)
    ledger_id = writer.ledger_ids[-1]
    await wait_until(lambda: [cluster.holds(i, NAME, ledger_id) for i in range(3)] == [13] * 3)
    assert len(cluster.servers[1].node.read(NAME, ledger_id, 0, 12)) == 2
    assert cluster.servers[1].node.read(NAME, ledger_id, 12, 12) == [sent[-1]]
    cluster.servers[2].node.delete(NAME, ledger_id)  # a replica that lost it all

    # the writer is gone without a clean close: the reader recovers the ledger
    reader = await ManagedLedger.open(NAME, store, cluster.storage(2, write=3, ack=2))
    assert cluster.holds(2, NAME, ledger_id) == 13  # copied back, a few entries at a time
    assert await payloads_of(reader) == sent
    await reader.close()
    with pytest.raises(LedgerFenced):
        await writer.close()


async def test_a_ledger_made_short_of_nodes_is_followed_by_a_whole_one_once_they_are_back(
    store: MetadataStore, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quorum_module, "RECHECK_S", 0.0)
    await started(cluster, 3)
    await cluster.stop(2)
    ledger = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    await ledger.append(b"on two")
    assert await ledgers_of(store) == [["b0", "b1"]]
    await ledger.append(b"still on two")  # (it checks after each write: two are alive)
    assert len(await ledgers_of(store)) == 1
    await cluster.start(2)

    async def rolled_to_three() -> bool:
        await ledger.append(b"x")
        return len((await ledgers_of(store))[-1]) == 3

    await wait_until(rolled_to_three, what="a ledger on three nodes")
    assert sorted((await ledgers_of(store))[-1]) == ["b0", "b1", "b2"]
    assert (await payloads_of(ledger))[:2] == [b"on two", b"still on two"]
    await ledger.close()


async def test_a_ledger_that_lost_copies_gets_new_ones_when_it_is_recovered(
    store: MetadataStore, cluster: Cluster
) -> None:
    """A ledger on two nodes (the third was down) loses one of them to a wiped disk, and its
    writer dies: one copy is left, fewer than the ack quorum. Recovery copies it to another
    live node and records the new placement (before, the ledger could never be opened
    again: the lost instance does not come back)."""
    await started(cluster, 3)
    await cluster.stop(2)
    writer = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    for i in range(5):
        await writer.append(f"c{i}".encode())
    assert await ledgers_of(store) == [["b0", "b1"]]
    await cluster.start(2)
    await cluster.restart(1, wipe=True)

    reader = await ManagedLedger.open(NAME, store, cluster.storage(2, write=3, ack=2))
    assert await payloads_of(reader) == [f"c{i}".encode() for i in range(5)]
    record = await store.get(metadata_key(NAME))
    assert record is not None
    replicas = decode(record.value).ledgers[0].replicas
    assert str(cluster.servers[0].member) in replicas
    assert len(replicas) == 2 and all(
        Member.parse(r) in {s.member for s in cluster.servers} for r in replicas
    )  # the wiped instance is gone from it; a live node took its place
    await reader.close()
    with pytest.raises(LedgerFenced):
        await writer.close()


def test_a_node_holds_a_bounded_number_of_replicas_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node touched every replica it serves: all stayed open (a file and an index each)
    until deleted, however many ledgers it held. The least recently used are closed now,
    and opened again on their next use, whole."""
    monkeypatch.setattr(node_module, "MAX_OPEN", 3)
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    for ledger_id in range(1, 9):
        node.create(NAME, ledger_id)
        node.append(NAME, ledger_id, 0, [f"e{ledger_id}".encode()], False)
        assert len(node._held) <= 3
    for ledger_id in range(1, 9):  # each reopened on use, as it was
        assert node.read(NAME, ledger_id, 0, 0) == [f"e{ledger_id}".encode()]
        assert node.append(NAME, ledger_id, 1, [b"more"], False) == 2
    assert len(node._held) <= 3
    node.close()


def test_a_replica_being_read_is_not_closed_under_the_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_module, "MAX_OPEN", 1)
    node = ReplicaNode(tmp_path, tail_bytes=1 << 20)
    node.create(NAME, 1)
    node.append(NAME, 1, 0, [b"held"], False)
    reading = node._held[(NAME, 1)]
    node._readers[(NAME, 1)] = 1  # a read in flight (it runs outside the lock)
    node.create(NAME, 2)  # over the limit: ledger 1 is the one to close, but it is in use
    assert node._held.get((NAME, 1)) is reading and reading.read(0, 0) == [b"held"]
    node._readers.clear()
    node.create(NAME, 3)  # now it can go
    assert (NAME, 1) not in node._held
    node.close()


async def test_a_ledger_made_short_asks_for_a_whole_one_no_sooner_than_a_recheck_period_later(
    store: MetadataStore, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that just died stays registered until its session expires: it counted as
    alive, so each ledger made short of it asked for a rollover at its first write, and
    the next was made short again (a topic rolled over at every write, about 20 ledgers
    in a second in tests/broker/test_repair.py). The first check now waits a period."""
    monkeypatch.setattr(quorum_module, "RECHECK_S", 3600.0)
    await started(cluster, 3)
    await cluster.stop(2)
    ledger = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    await cluster.start(2)  # (as a dead node still registered looks: counted alive)
    for i in range(5):
        await ledger.append(f"e{i}".encode())
    assert await ledgers_of(store) == [["b0", "b1"]]
    await ledger.close()
