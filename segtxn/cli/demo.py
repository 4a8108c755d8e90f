"""``segtxn demo``: transaction-shaped records through the metadata store, watched live.

It plays the record traffic of PIP-471 against a real store: transaction headers created
OPEN and indexed by deadline, op records under sequential keys indexed by segment, one
compare-and-set per end-txn (with a deliberate race that exactly one side must win), and
participants that learn each outcome from a watch. It then checks what the watchers saw
against what was written, prints a summary, and exits non-zero on any mismatch.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import click

from segtxn.metastore import (
    MUST_NOT_EXIST,
    BadVersion,
    EventKind,
    LeaderElection,
    MetadataStore,
    Put,
    open_store,
)
from segtxn.metastore.etcd_server import EtcdServer

SEGMENTS = [f"segment://demo/ns/orders/{i}" for i in range(4)]


@dataclass
class Seen:
    decisions: dict[str, str] = field(default_factory=dict)
    ops_indexed: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)


async def run_demo(url: str, *, transactions: int, seed: int | None) -> bool:
    seed = seed if seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    async with AsyncExitStack() as stack:
        if url == "etcd-local":
            server = EtcdServer.in_temp_dir()
            await server.astart()
            stack.callback(server.stop)
            url = server.url("/demo")
            click.echo(f"started etcd at {server.endpoint} (data in {server.data_dir})")
        store = open_store(url)
        stack.push_async_callback(store.close)
        click.echo(f"store {url}  seed {seed}  transactions {transactions}")
        return await _play(store, rng, transactions)
    raise AssertionError("unreachable")  # pragma: no cover


async def _play(store: MetadataStore, rng: random.Random, transactions: int) -> bool:
    start_revision = await store.revision() + 1
    seen = Seen()
    written: dict[str, str] = {}
    commit_times: dict[str, float] = {}
    watcher = asyncio.create_task(
        _participant(store, start_revision, transactions, seen, commit_times), name="demo-watch"
    )
    began = time.perf_counter()
    races_won = 0
    for n in range(transactions):
        txn_id = f"{n:08d}"
        now_ms = int(time.time() * 1000)
        deadline_ms = now_ms + 30_000
        header = {"state": "OPEN", "timeout_ms": deadline_ms, "created_ms": now_ms}
        record = await store.put(
            f"/txn/{txn_id}",
            json.dumps(header).encode(),
            expected_version=MUST_NOT_EXIST,
            partition_key=txn_id,
            indexes={"txn-by-deadline": deadline_ms},
        )
        segments = rng.sample(SEGMENTS, rng.randint(1, 3))
        await store.commit(
            [
                Put(
                    f"/txn-op/{txn_id}/",
                    json.dumps({"kind": "write", "segment": s, "position": [1, n]}).encode(),
                    sequential=True,
                    partition_key=txn_id,
                    indexes={"writes-by-segment": s},
                )
                for s in segments
            ]
        )
        decision = "COMMITTED" if rng.random() < 0.8 else "ABORTED"
        final = dict(header, state=decision, finalized_ms=int(time.time() * 1000))
        rival = dict(final, state="ABORTED" if decision == "COMMITTED" else "COMMITTED")
        commit_times[txn_id] = time.perf_counter()

        mine, theirs = await asyncio.gather(
            _end_txn(store, txn_id, final, record.version),
            _end_txn(store, txn_id, rival, record.version),
        )
        if mine == theirs:
            click.echo(f"txn {txn_id}: both or neither end-txn CAS won", err=True)
            return False
        winner = final if mine else rival
        races_won += mine
        written[txn_id] = str(winner["state"])
    elapsed = time.perf_counter() - began
    try:
        await asyncio.wait_for(seen.done.wait(), timeout=30)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)

    open_left = await store.index_range("txn-by-deadline")
    by_state = {
        s: len((await store.index_range("txn-by-final-state", (s,))).entries)
        for s in ("COMMITTED", "ABORTED")
    }
    ops = await store.index_range("writes-by-segment")
    leader_ok = await _election_handover(store)
    mismatches = {t for t in written if seen.decisions.get(t) != written[t]}
    lat = sorted(seen.latencies_ms) or [0.0]
    click.echo(
        f"wrote {transactions} txns in {elapsed:.2f}s "
        f"({transactions / elapsed:.0f} txn/s: create + ops + racing end-txn CAS)"
    )
    click.echo(f"end-txn races: exactly one winner every time (ours won {races_won})")
    click.echo(
        f"watch saw {len(seen.decisions)} decisions; decided->seen p50 "
        f"{lat[len(lat) // 2]:.2f} ms, p99 {lat[int(len(lat) * 0.99)]:.2f} ms"
    )
    click.echo(
        f"indexes: {len(open_left.entries)} open by deadline, {by_state} by final state, "
        f"{len(ops.entries)} ops by segment (watch saw {seen.ops_indexed})"
    )
    click.echo(f"leader election hand-over: {'ok' if leader_ok else 'FAILED'}")
    ok = (
        not mismatches
        and not open_left.entries
        and sum(by_state.values()) == transactions
        and seen.ops_indexed == len(ops.entries)
        and leader_ok
    )
    click.echo("RESULT: " + ("every decision seen, indexes consistent" if ok else "MISMATCH"))
    return ok


async def _end_txn(
    store: MetadataStore, txn_id: str, body: dict[str, object], expected: int
) -> bool:
    """One end-txn: a CAS of the header from OPEN to a decision. False if it lost."""
    state, finalized_ms = str(body["state"]), int(str(body["finalized_ms"]))
    try:
        await store.put(
            f"/txn/{txn_id}",
            json.dumps(body).encode(),
            expected_version=expected,
            indexes={"txn-by-final-state": (state, finalized_ms)},
        )
        return True
    except BadVersion:
        return False


async def _participant(
    store: MetadataStore,
    start_revision: int,
    transactions: int,
    seen: Seen,
    commit_times: dict[str, float],
) -> None:
    """Learn outcomes from a prefix watch, as a PIP-471 participant does."""

    async def ops() -> None:
        async with store.watch_index("writes-by-segment", from_revision=start_revision) as events:
            async for event in events:
                if event.kind is EventKind.PUT:
                    seen.ops_indexed += 1

    op_task = asyncio.create_task(ops(), name="demo-watch-ops")
    try:
        async with store.watch_prefix("/txn/", from_revision=start_revision) as events:
            async for event in events:
                if event.record is None:
                    continue
                state = json.loads(event.record.value)["state"]
                if state == "OPEN":
                    continue
                txn_id = event.key.rsplit("/", 1)[1]
                seen.decisions[txn_id] = state
                seen.latencies_ms.append((time.perf_counter() - commit_times[txn_id]) * 1000)
                if len(seen.decisions) == transactions:
                    seen.done.set()
    finally:
        op_task.cancel()
        await asyncio.gather(op_task, return_exceptions=True)


async def _election_handover(store: MetadataStore) -> bool:
    first, second = await store.open_session(ttl_s=5), await store.open_session(ttl_s=5)
    try:
        a = await LeaderElection(store, "demo", first, b"a").campaign()
        b_task = asyncio.create_task(LeaderElection(store, "demo", second, b"b").campaign())
        await first.close()  # the leader dies: its lease goes, the standby takes over
        b = await asyncio.wait_for(b_task, timeout=10)
        leader = await LeaderElection(store, "demo", second).leader()
        ok = a.lost.is_set() or await _wait(a.lost)
        await b.resign()
        return ok and leader is not None and leader.value == b"b" and b.token > a.token
    finally:
        await second.close()


async def _wait(event: asyncio.Event) -> bool:
    try:
        await asyncio.wait_for(event.wait(), timeout=5)
        return True
    except TimeoutError:
        return False
