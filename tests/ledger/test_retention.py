"""Retention: the selection rules (pure), then trims of real managed ledgers: recovery
rollovers, ledgers without cursors, reads in flight, readers from earliest."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import msgspec
import pytest

from segtxn.ledger import (
    FileLogStorage,
    LedgerSettings,
    LogStorage,
    ManagedLedger,
    Position,
    RetentionPolicy,
)
from segtxn.ledger.logs import LOCAL, EntryLog, Placement, Recovered
from segtxn.ledger.managed import LedgerMetadata, metadata_key
from segtxn.ledger.retention import DEFAULT_RETENTION_TIME_S, ClosedLedger, deletable
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import EtcdServer
from tests.ledger.conftest import OpenLedger
from tests.ledger.test_crash import run_and_kill
from tests.waiting import wait_until

HOUR_MS = 3600 * 1000
NOW_MS = 1_000_000 * HOUR_MS
DAY_S = 24 * 3600.0


def ledgers(*closed_hours_ago: float, entries: int = 10, size: int = 1000) -> list[ClosedLedger]:
    """Closed ledgers 1, 2, ... closed that many hours before NOW_MS."""
    return [
        ClosedLedger(i, entries, int(NOW_MS - hours * HOUR_MS), size)
        for i, hours in enumerate(closed_hours_ago, start=1)
    ]


def ids(chosen: Sequence[ClosedLedger]) -> list[int]:
    return [ledger.id for ledger in chosen]


def consumed_through(ledger_id: int) -> Position:
    return Position(ledger_id, 9)  # the last entry of a 10-entry ledger


# ================================================================= the rules, pure


def test_the_defaults_are_kafkas_a_week_and_no_size_limit() -> None:
    assert RetentionPolicy() == RetentionPolicy(retention_time_s=7 * DAY_S, retention_bytes=-1)
    assert DEFAULT_RETENTION_TIME_S * 1000 == 604_800_000  # retention.ms


@pytest.mark.parametrize(
    ("time_s", "size"), [(-2, -1), (-0.5, -1), (float("nan"), -1), (float("inf"), -1), (0, -7)]
)
def test_a_limit_is_minus_one_or_not_negative(time_s: float, size: int) -> None:
    with pytest.raises(ValueError, match="-1"):
        RetentionPolicy(retention_time_s=time_s, retention_bytes=size)


def test_without_cursors_a_time_limit_keeps_each_ledger_that_long_after_it_closed() -> None:
    chain = ledgers(30, 20, 1)  # closed 30 h, 20 h and 1 h ago
    day = RetentionPolicy(retention_time_s=DAY_S)
    assert ids(deletable(chain, [], day, NOW_MS)) == [1]
    assert ids(deletable(chain, [], day, NOW_MS + 5 * HOUR_MS)) == [1, 2]
    assert ids(deletable(chain, [], RetentionPolicy(), NOW_MS)) == []  # a week


@pytest.mark.parametrize("time_s", [0, -1])
def test_without_cursors_and_without_a_positive_time_limit_nothing_goes(time_s: float) -> None:
    chain = ledgers(10_000, 5_000, 0)
    for size in (-1, 0, 1):  # the size axis counts consumed data only
        policy = RetentionPolicy(retention_time_s=time_s, retention_bytes=size)
        assert deletable(chain, [], policy, NOW_MS) == []


def test_consumed_ledgers_go_once_old_enough_and_unconsumed_ones_never() -> None:
    chain = ledgers(48, 30, 2)
    day = RetentionPolicy(retention_time_s=DAY_S)
    assert ids(deletable(chain, [consumed_through(3)], day, NOW_MS)) == [1, 2]
    # every cursor counts: the slowest one holds ledger 2 back, however old
    slow = [consumed_through(3), consumed_through(1)]
    assert ids(deletable(chain, slow, day, NOW_MS)) == [1]
    # a ledger partly consumed is not consumed
    assert ids(deletable(chain, [Position(2, 8)], day, NOW_MS)) == [1]
    assert deletable(chain, [Position(1, -1)], RetentionPolicy(0, 0), NOW_MS) == []
    # time 0: as soon as consumed, however young
    assert ids(deletable(chain, [consumed_through(3)], RetentionPolicy(0), NOW_MS)) == [1, 2, 3]


def test_the_size_axis_keeps_the_newest_consumed_bytes() -> None:
    chain = ledgers(3, 2, 1, 0)  # four consumed ledgers of 1000 bytes, all young
    marks = [consumed_through(4)]

    def by_size(size: int) -> list[int]:
        policy = RetentionPolicy(retention_time_s=-1, retention_bytes=size)
        return ids(deletable(chain, marks, policy, NOW_MS))

    assert by_size(0) == [1, 2, 3, 4]
    assert by_size(1000) == [1, 2, 3]  # ledger 4 alone holds 1000 bytes
    assert by_size(1500) == [1, 2]  # at least 1500 kept: ledgers 3 and 4
    assert by_size(3000) == [1]
    assert by_size(3001) == []
    assert by_size(-1) == []
    # unconsumed data does not count toward the size kept
    assert ids(deletable(chain, [consumed_through(2)], RetentionPolicy(-1, 1000), NOW_MS)) == [1]


def test_time_or_size_whichever_lets_go_first() -> None:
    chain = ledgers(48, 47, 1, 0)
    marks = [consumed_through(4)]
    policy = RetentionPolicy(retention_time_s=DAY_S, retention_bytes=2500)
    assert ids(deletable(chain, marks, policy, NOW_MS)) == [1, 2]  # by time
    policy = RetentionPolicy(retention_time_s=DAY_S, retention_bytes=1000)
    assert ids(deletable(chain, marks, policy, NOW_MS)) == [1, 2, 3]  # 3 by size


def test_no_limit_on_either_axis_keeps_consumed_data_forever() -> None:
    chain = ledgers(10**6, 10**5)
    policy = RetentionPolicy(retention_time_s=-1, retention_bytes=-1)
    assert deletable(chain, [consumed_through(2)], policy, NOW_MS) == []


def test_only_the_front_of_the_chain_goes_and_empty_ledgers_hold_nothing() -> None:
    # a young consumed ledger stops the trim even if an older one follows it
    chain = [*ledgers(48, 1), ClosedLedger(3, 10, int(NOW_MS - 48 * HOUR_MS), 1000)]
    day = RetentionPolicy(retention_time_s=DAY_S)
    assert ids(deletable(chain, [consumed_through(3)], day, NOW_MS)) == [1]
    empty = [ClosedLedger(1, 0, NOW_MS, 0), ClosedLedger(2, 0, NOW_MS, 0)]
    assert ids(deletable(empty, [], RetentionPolicy(-1, -1), NOW_MS)) == [1, 2]


# ================================================================= real managed ledgers


SMALL = 600
"""max_ledger_bytes that makes ledgers of 3 :func:`fill` entries, in files (with their
header and acknowledgement marks) and in memory alike."""


async def fill(ledger: ManagedLedger, n: int) -> list[Position]:
    """``n`` entries of 200 bytes (with max_ledger_bytes=SMALL: 3 per ledger)."""
    return [await ledger.append(f"e{i:03}".encode() * 50) for i in range(n)]


async def read_all(ledger: ManagedLedger) -> list[Position]:
    return [e.position for e in await ledger.read(Position(0, 0), max_entries=10_000)]


async def test_a_reopen_makes_nothing_deletable_without_cursors(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_ledger_bytes=SMALL)
    written = await fill(ledger, 7)
    await ledger.close()
    ledger = await open_ledger(max_ledger_bytes=SMALL)  # the last ledger is closed on reopen
    now = time.time()
    for policy in (RetentionPolicy(), RetentionPolicy(0, 0), RetentionPolicy(-1, 0)):
        assert (await ledger.trim(policy, now_s=now)).ledgers == []
    assert (await ledger.trim(RetentionPolicy(), now_s=now + 6 * DAY_S)).ledgers == []
    assert await read_all(ledger) == written
    # without cursors a ledger goes only once the time limit has passed since it closed
    gone = await ledger.trim(RetentionPolicy(), now_s=now + 8 * DAY_S)
    assert gone.ledgers == sorted({p.ledger_id for p in written})
    assert await read_all(ledger) == []


async def test_age_counts_from_the_close_not_the_creation(
    open_ledger: OpenLedger, store: MetadataStore
) -> None:
    ledger = await open_ledger(max_ledger_bytes=SMALL)
    cursor = await ledger.open_cursor("sub", start="earliest")
    written = await fill(ledger, 4)  # ledger 1 holds 3 entries, ledger 2 is being written
    await cursor.ack_cumulative(written[-1])
    record = await store.get(metadata_key(ledger.name))
    assert record is not None
    first = msgspec.json.decode(record.value, type=LedgerMetadata).ledgers[0]
    assert first.entries == 3 and first.closed_ms is not None and first.size_bytes
    hour = RetentionPolicy(retention_time_s=3600)
    # an hour after it was created, but not an hour after it closed: kept
    created_s = first.created_ms / 1000
    assert (await ledger.trim(hour, now_s=created_s + 3600 - 0.001)).ledgers == []
    assert (await ledger.trim(hour, now_s=first.closed_ms / 1000 + 3599)).ledgers == []
    assert (await ledger.trim(hour, now_s=first.closed_ms / 1000 + 3600)).ledgers == [1]


async def test_old_metadata_records_count_from_the_next_ledgers_creation(
    open_ledger: OpenLedger, store: MetadataStore
) -> None:
    """Records written before closed_ms and size_bytes were kept still decode; a ledger's
    age then counts from when its successor was created (which is when it closed)."""
    ledger = await open_ledger(max_ledger_bytes=SMALL)
    cursor = await ledger.open_cursor("sub", start="earliest")
    written = await fill(ledger, 7)
    await cursor.ack_cumulative(written[-1])
    await ledger.close()
    key = metadata_key(ledger.name)
    record = await store.get(key)
    assert record is not None
    meta = msgspec.json.decode(record.value)
    for info in meta["ledgers"]:  # as the previous version wrote them
        info.pop("closed_ms"), info.pop("size_bytes")
    old = {
        **meta,
        "ledgers": [{**i, "created_ms": 1000 * (i["id"] * 3600)} for i in meta["ledgers"]],
    }
    await store.put(key, msgspec.json.encode(old), expected_version=record.version)
    ledger = await open_ledger(max_ledger_bytes=SMALL)
    infos = ledger._meta.ledgers
    assert infos[0].closed_ms is None and infos[-2].closed_ms is not None  # recovered now
    hour = RetentionPolicy(retention_time_s=3600)
    # ledger 1 closed when ledger 2 was created (2 h after the epoch): gone an hour later
    assert (await ledger.trim(hour, now_s=2 * 3600 + 3599)).ledgers == []
    assert (await ledger.trim(hour, now_s=2 * 3600 + 3600)).ledgers == [1]


async def test_consumed_ledgers_go_and_the_open_ledger_never(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_ledger_bytes=SMALL)
    cursor = await ledger.open_cursor("sub", start="earliest")
    written = await fill(ledger, 10)
    await cursor.ack_cumulative(written[-1])  # everything consumed, the open ledger too
    result = await ledger.trim(RetentionPolicy(0, 0))
    current = written[-1].ledger_id
    assert result.ledgers == sorted({p.ledger_id for p in written} - {current})
    assert result.first_retained == Position(current, 0)
    assert await read_all(ledger) == [p for p in written if p.ledger_id == current]


async def test_a_sealed_ledger_keeps_its_last_ledger(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_ledger_bytes=SMALL)
    cursor = await ledger.open_cursor("sub", start="earliest")
    written = await fill(ledger, 6)
    await ledger.terminate()
    await cursor.ack_cumulative(written[-1])
    result = await ledger.trim(RetentionPolicy(0, 0))
    assert written[-1].ledger_id not in result.ledgers
    assert (await read_all(ledger))[-1] == written[-1]


async def test_the_size_axis_on_a_real_ledger(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_ledger_bytes=SMALL)
    cursor = await ledger.open_cursor("sub", start="earliest")
    written = await fill(ledger, 13)  # ledgers of 3 entries
    await cursor.ack_cumulative(written[-1])
    closed = sorted({p.ledger_id for p in written} - {written[-1].ledger_id})
    size = ledger._meta.ledgers[0].size_bytes  # as the storage counts it
    assert size and all(i.size_bytes == size for i in ledger._meta.ledgers[:-1])
    keep_two = RetentionPolicy(retention_time_s=-1, retention_bytes=2 * size)
    assert (await ledger.trim(keep_two)).ledgers == closed[:-2]
    assert (await ledger.trim(keep_two)).ledgers == []  # idempotent
    assert (await ledger.trim(RetentionPolicy(-1, -1))).ledgers == []


async def test_concurrent_trims_remove_each_ledger_once(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_ledger_bytes=SMALL)
    cursor = await ledger.open_cursor("sub", start="earliest")
    written = await fill(ledger, 10)
    await cursor.ack_cumulative(written[-1])
    results = await asyncio.gather(*(ledger.trim(RetentionPolicy(0, 0)) for _ in range(3)))
    removed = [i for r in results for i in r.ledgers]
    assert sorted(removed) == sorted(set(removed)) and len(removed) == 3
    assert not ledger._logs.doomed


async def test_earliest_starts_at_the_first_retained_entry(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(max_ledger_bytes=SMALL)
    sub = await ledger.open_cursor("sub", start="earliest")
    written = await fill(ledger, 10)
    await sub.ack_cumulative(written[5])
    result = await ledger.trim(RetentionPolicy(0, 0))
    first = result.first_retained
    assert first is not None and first == written[6] == ledger.first_position()
    late = await ledger.open_cursor("late", start="earliest")
    assert late.backlog() == 4 and ledger.position_after(late.mark_delete) == first
    assert (await ledger.read(written[0]))[0].position == first  # clamped forward


# ================================================================= reads during a trim


class _GatedLog(EntryLog):
    def __init__(self, inner: EntryLog, gate: _Gate) -> None:
        self._inner = inner
        self._gate = gate
        self.ledger_id = inner.ledger_id
        self.nonce = inner.nonce

    @property
    def count(self) -> int:
        return self._inner.count

    def append_batch(self, payloads: Sequence[bytes]) -> None:
        self._inner.append_batch(payloads)

    def read(self, first: int, last: int) -> list[bytes]:
        if self.ledger_id == self._gate.ledger_id:
            self._gate.entered.set()
            if not self._gate.release.wait(timeout=30):
                raise TimeoutError("the test never released the read")
        return self._inner.read(first, last)

    def size_bytes(self) -> int:
        return self._inner.size_bytes()

    def close(self) -> None:
        self._inner.close()


class _Gate(LogStorage):
    """A storage whose reads of one ledger wait until the test releases them."""

    def __init__(self, inner: LogStorage, ledger_id: int) -> None:
        self._inner = inner
        self.ledger_id = ledger_id
        self.entered = threading.Event()
        self.release = threading.Event()

    def where(self, ledger_name: str, ledger_id: int) -> str:
        return self._inner.where(ledger_name, ledger_id)

    def exists(self, ledger_name: str, ledger_id: int) -> bool:
        return self._inner.exists(ledger_name, ledger_id)

    def create(self, ledger_name: str, ledger_id: int) -> EntryLog:
        return _GatedLog(self._inner.create(ledger_name, ledger_id), self)

    def recover(
        self,
        ledger_name: str,
        ledger_id: int,
        *,
        log_format: int,
        tail_bytes: int,
        placement: Placement = LOCAL,
        nonce: int | None = None,
    ) -> Recovered:
        recovered = self._inner.recover(
            ledger_name, ledger_id, log_format=log_format, tail_bytes=tail_bytes, nonce=nonce
        )
        return Recovered(_GatedLog(recovered.log, self), recovered.truncation)

    def open(
        self,
        ledger_name: str,
        ledger_id: int,
        *,
        log_format: int,
        entries: int,
        size_bytes: int | None = None,
        placement: Placement = LOCAL,
        nonce: int | None = None,
    ) -> EntryLog:
        opened = self._inner.open(
            ledger_name,
            ledger_id,
            log_format=log_format,
            entries=entries,
            size_bytes=size_bytes,
            nonce=nonce,
        )
        return _GatedLog(opened, self)

    def delete(self, ledger_name: str, ledger_id: int, placement: Placement = LOCAL) -> None:
        self._inner.delete(ledger_name, ledger_id)


async def test_a_read_across_ledgers_trimmed_under_it_is_served_or_skipped(
    store: MetadataStore, storage: LogStorage
) -> None:
    """A read holds the ledger it is in against deletion; ledgers after it that a trim
    deletes meanwhile are skipped (not reopened from a deleted file)."""
    settings = LedgerSettings(max_ledger_bytes=SMALL)
    ledger = await ManagedLedger.open("persistent://t/n/gated", store, storage, settings)
    cursor = await ledger.open_cursor("sub", start="earliest")
    written = await fill(ledger, 10)  # ledgers 1, 2, 3 closed; 4 being written
    await cursor.ack_cumulative(written[-1])
    await ledger.close()
    gate = _Gate(storage, written[0].ledger_id)
    ledger = await ManagedLedger.open("persistent://t/n/gated", store, gate, settings)
    try:
        reading = asyncio.create_task(ledger.read(written[0], max_entries=100))
        await wait_until(gate.entered.is_set, what="the read inside ledger 1")
        trimmed = await ledger.trim(RetentionPolicy(0, 0))
        assert trimmed.ledgers == [1, 2, 3, 4]  # 4 was closed by the reopen
        assert 1 in ledger._logs.doomed  # held by the read
        gate.release.set()
        entries = await reading
        assert [e.position for e in entries] == written[:3]  # ledger 1 served, 2-4 skipped
        assert not ledger._logs.doomed and 1 not in ledger._logs  # deleted once the read ended
    finally:
        gate.release.set()
        await ledger.close()


# ================================================================= after a real crash


@pytest.fixture
async def etcd_store(etcd_server: EtcdServer, tmp_path: Path) -> AsyncIterator[MetadataStore]:
    async with open_store(etcd_server.url(f"/retention-{os.getpid()}-{tmp_path.name}")) as s:
        yield s


@pytest.mark.slow
async def test_after_a_sigkill_every_acknowledged_entry_survives_retention(
    etcd_server: EtcdServer, etcd_store: MetadataStore, tmp_path: Path
) -> None:
    """The issue: a writer SIGKILLed, its ledger reopened (recovered, closed, rolled over)
    with no cursors: no retention policy deletes what was acknowledged."""
    seed = random.randrange(2**32)
    print(f"retention crash seed {seed}")
    name = "segment://t/n/output/3"
    url = etcd_server.url(f"/retention-{os.getpid()}-{tmp_path.name}")
    acked: list[Position] = []
    for round_ in range(2):  # two crashes: two recovery rollovers
        lines = run_and_kill(
            url, tmp_path, name, mode="append", seed=seed + round_, kill_after_acks=300
        )
        acked += [Position.parse(ln.split()[1]) for ln in lines if ln.startswith("ACK ")]
    storage = FileLogStorage(tmp_path)
    settings = LedgerSettings(max_ledger_bytes=64 * 1024, max_batch_bytes=32 * 1024)
    ledger = await ManagedLedger.open(name, etcd_store, storage, settings)
    try:
        assert not ledger.cursors
        now = time.time()
        for policy in (
            RetentionPolicy(),
            RetentionPolicy(0, 0),
            RetentionPolicy(retention_time_s=0, retention_bytes=-1),
            RetentionPolicy(retention_time_s=-1, retention_bytes=0),
        ):
            result = await ledger.trim(policy, now_s=now)
            assert result.entries == 0, f"{policy} trimmed {result}"
        # a week later (the default), measured from the recovery, not from creation
        assert (await ledger.trim(RetentionPolicy(), now_s=now + 6.9 * DAY_S)).entries == 0
        stored = set(await read_all(ledger))
        assert set(acked) <= stored, f"lost {sorted(set(acked) - stored)[:5]}"
    finally:
        await ledger.close()
