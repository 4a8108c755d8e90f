"""Replicated ledgers at their edges: the repair of a damaged copy, a read that meets one
damaged copy while the others are away, a ledger named like a node's own file, and new
ledgers while a broker drains.

Same harness as tests/ledger/test_replicated*.py: real ``ReplicaNode``s on real files
behind real aiohttp servers (tests/ledger/replicas.py), managed ledgers on the in-memory
metadata store. Each test failed before its fix (a review).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from segtxn.broker.replication import BrokerNodes
from segtxn.ledger import FileLogStorage, LedgerCorrupted, LedgerError, ManagedLedger
from segtxn.ledger.managed import metadata_key
from segtxn.ledger.metadata import LedgerInfo, decode
from segtxn.ledger.records import ENTRY_OVERHEAD, HEADER_SIZE
from segtxn.ledger.replicas import Member, Outcome, ReplicatedLogStorage, repair_ledger
from segtxn.metastore import MetadataStore
from segtxn.topics.catalog import Catalog
from tests.ledger.replicas import Cluster, payloads_of, started

NAME = "persistent://t/n/review-r9"
SENT = [f"r9-{i:03d}".encode() * 4 for i in range(5)]


async def stored(store: MetadataStore) -> dict[int, LedgerInfo]:
    record = await store.get(metadata_key(NAME))
    assert record is not None
    return {i.id: i for i in decode(record.value).ledgers}


def flip_a_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------- a damaged copy


async def test_a_copy_found_damaged_is_replaced_by_the_repair(
    store: MetadataStore, cluster: Cluster
) -> None:
    """b1's copy of a closed ledger has a bit flipped in an acknowledged entry (its node
    detects it when it opens the file: every request for it gets ``Corrupted``). The
    repair takes it for lost and makes a good copy on a live node (b3). It took it for a
    silent one and kept it: with W copies "kept" it never made a new one, and the ledger
    stayed on two good copies for ever (one more loss below the ack quorum away)."""
    await started(cluster, 4)
    await cluster.stop(3)  # the ledger goes on b0, b1, b2
    ledger = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    for payload in SENT:
        await ledger.append(payload)
    await ledger.roll_over()  # ledger 1 closes, whole on its three copies
    info = next(i for i in ledger.ledgers if i.entries == len(SENT))
    assert sorted(Member.parse(m).broker for m in info.replicas) == ["b0", "b1", "b2"]
    await cluster.start(3)

    # a bit flips in entry 0 of b1's copy (its node restarts, and scans the file again)
    path = cluster.servers[1].node._files.path(NAME, info.id)
    flip_a_bit(path, HEADER_SIZE + ENTRY_OVERHEAD)
    await cluster.restart(1)  # (its node drops the handle it held, and opens it again)
    with pytest.raises(LedgerError, match=r"fails its checksum|damaged|Corrupted"):
        cluster.servers[1].node.stat(NAME, info.id)
    try:
        assert await payloads_of(ledger) == SENT  # not served: read from the others
        outcome = await repair_ledger(
            ledger, info, cluster.census(), cluster.nodes(0), write_quorum=3, commit_within_s=60.0
        )
    finally:
        await ledger.close()

    after = (await stored(store))[info.id]
    good = [
        m
        for m in map(Member.parse, after.replicas)
        if m.broker != "b1" and cluster.holds(int(m.broker[1:]), NAME, info.id) == len(SENT)
    ]
    assert outcome is Outcome.REPAIRED and len(good) == 3, (
        f"the damaged copy on b1 was not replaced: repair answered {outcome}, the ledger is "
        f"kept on {list(after.replicas)} ({len(good)} good copies)"
    )


# ----------------------------------------------------------------- a fenced copy lost


async def test_a_lost_copy_of_a_recovered_ledger_is_made_again_on_its_own_node(
    store: MetadataStore, cluster: Cluster
) -> None:
    """Every ledger a recovery closed (a crash, a take-over) has a ``.fenced`` file next
    to each copy. b2 is alive but its copy's file is gone (a "lost" copy in repair.py's
    terms), and with exactly W brokers b2 is the only node that may take a new copy. The
    repair makes it there: its recovery appends pass the fence. It made it with
    ``create``, which refuses a fenced replica, so the copy was never made: the ledger
    stayed one copy short for ever, with nothing said but the gauge."""
    await started(cluster, 3)
    writer = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    for payload in SENT:
        await writer.append(payload)
    ledger_id = writer.ledger_ids[-1]
    # the writer dies (no clean close); b1 opens the topic: recovery fences ledger 1
    owner = await ManagedLedger.open(NAME, store, cluster.storage(1, write=3, ack=2))
    info = (await stored(store))[ledger_id]
    assert info.entries == len(SENT) and len(info.replicas) == 3
    # b2's copy's file is lost (its fence stays); its node starts again on that disk
    node = cluster.servers[2].node
    log_path = node._files.path(NAME, ledger_id)
    assert log_path.with_suffix(".fenced").exists()
    await cluster.restart(2)
    os.unlink(log_path)
    census = cluster.census()
    assert census.targets_for([cluster.servers[0].member, cluster.servers[1].member]) == [
        cluster.servers[2].member
    ]

    try:
        outcome = await repair_ledger(
            owner, info, census, cluster.nodes(1), write_quorum=3, commit_within_s=60.0
        )
    finally:
        await owner.close()
        with pytest.raises(LedgerError):  # (fenced by the recovery)
            await writer.close()

    assert outcome is Outcome.REPAIRED and cluster.holds(2, NAME, ledger_id) == len(SENT), (
        f"repair answered {outcome}; b2 holds {cluster.holds(2, NAME, ledger_id)} of the "
        f"{len(SENT)} entries (its create is refused: the replica is fenced)"
    )


# ----------------------------------------------------------------- the wire's edge


@pytest.mark.parametrize("op", ["create", "fence", "append", "delete"])
async def test_a_ledger_named_like_the_nodes_identity_file_gets_a_named_error(
    cluster: Cluster, op: str
) -> None:
    """A ledger name quotes to the directory holding its replicas under the node's root;
    ``.instance`` quotes to itself, the node's identity *file*. The request then fails
    inside the node with NotADirectoryError, which no handler names: it was a bare 500
    (and a traceback in the broker's log). It is refused as ``.`` and ``..`` are."""
    server = await cluster.add()
    name = ".instance"
    params = {"instance": server.node.instance, "ledger": name, "id": "1", "first": "0"}
    body = b"\x00\x00\x00\x01x" if op == "append" else b""
    async with cluster.session.post(
        f"{server.url}/replica/v1/{op}", params=params, data=body
    ) as response:
        status = response.status
        text = await response.text()
    assert 400 <= status < 500, f"{op} of ledger {name!r}: HTTP {status} {text[:80]!r}"
    assert (server.root / "replicas" / ".instance").read_text().strip() == server.node.instance


# ----------------------------------------------------------------- reads


async def test_one_damaged_copy_and_the_others_away_is_retriable_not_damage(
    store: MetadataStore, cluster: Cluster
) -> None:
    """A closed ledger on b0, b1, b2: b0's copy (the reader's own, read first) is damaged
    and b1 and b2 are away for a moment. Good copies exist, so the read fails as retriable
    (``NotEnoughReplicas``: they come back). It raised ``LedgerCorrupted``: its "every
    replica said corrupted" test counted *all* problems, and the broker answered
    PersistenceError, though a retry a moment later (b1 back) reads every entry."""
    await started(cluster, 3)
    ledger = await ManagedLedger.open(NAME, store, cluster.storage(0, write=3, ack=2))
    try:
        for payload in SENT:
            await ledger.append(payload)
        await ledger.roll_over()
        info = next(i for i in ledger.ledgers if i.entries == len(SENT))
        path = cluster.servers[0].node._files.path(NAME, info.id)
        flip_a_bit(path, HEADER_SIZE + ENTRY_OVERHEAD)  # entry 0 of b0's copy (held open)
        await cluster.stop(1)
        await cluster.stop(2)
        with pytest.raises(LedgerError) as raised:
            await payloads_of(ledger)
        await cluster.start(1)
        assert await payloads_of(ledger) == SENT  # a moment later: every entry, from b1
    finally:
        await ledger.close()
    assert raised.value.retriable and not isinstance(raised.value, LedgerCorrupted), (
        f"{type(raised.value).__name__} (retriable={raised.value.retriable}): {raised.value}"
    )


# ----------------------------------------------------------------- placement


async def test_a_new_ledger_is_not_placed_on_a_draining_broker(
    store: MetadataStore, cluster: Cluster
) -> None:
    """docs/ledger.md (Drain): draining "registers the broker as draining, so nothing new
    is placed on or taken over by it", and a repair never copies to one (``Census``'s
    targets). A broker's directory of storage nodes (``CatalogNodes.alive``) listed
    draining brokers too, so every ledger made meanwhile put a copy on the broker about
    to go away. Here b1 drains while b0 writes: with b0 and b2 left, the new ledger goes
    on those two (short, widened later), not on b1."""
    await started(cluster, 3)
    catalog = Catalog(store)
    session = await store.open_session(30)
    for i, server in enumerate(cluster.servers):
        await catalog.register_broker(
            server.broker, server.url, session, instance=server.node.instance, draining=i == 1
        )
    node = cluster.servers[0].node
    nodes = BrokerNodes(catalog, node, "b0", timeout_s=2.0)
    await nodes.start()
    storage = ReplicatedLogStorage(
        nodes, FileLogStorage(cluster.servers[0].root / "local"), write_quorum=3, ack_quorum=2
    )
    try:
        ledger = await ManagedLedger.open(NAME, store, storage)
        try:
            await ledger.append(b"while b1 drains")
        finally:
            await ledger.close()
        (info,) = (await stored(store)).values()
        brokers = sorted(Member.parse(m).broker for m in info.replicas)
    finally:
        await nodes.close()
        await session.close()
    assert "b1" not in brokers, f"a ledger made while b1 drains went on {brokers}"
