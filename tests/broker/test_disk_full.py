"""A broker whose data disk fills up, then has room again, through real brokers and clients.

The full disk is injected (CI may not mount a small filesystem): while it is full, writes
to the broker's ledger files store a prefix of their bytes and then fail with ENOSPC, as a
real full disk does, and new ledger files cannot be made. Either where it bites: an append,
or the rollover to a new ledger (a small ``max_ledger_bytes``). Measured by hand on a 2 MiB
tmpfs first (the report of this change), with the same outcome.

The contract: a producer gets a retriable ``ServiceNotReady`` that says the disk is full
(never a fatal error, a 5xx or a hang), nothing acknowledged is lost or duplicated, a
transaction whose send could not be stored does not commit it, and once there is room the
broker serves the topic again by itself: the same producer's next send is stored.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.client import Client, ErrorCategory, ErrorName, MessageId, ServerError, Timeout
from segtxn.ledger import LedgerSettings
from segtxn.ledger.files import FileEntryLog, FileLogStorage
from segtxn.protocol.names import TopicName
from tests.broker.conftest import StartBroker
from tests.cluster import Cluster
from tests.waiting import wait_until


class FullDisk:
    """ENOSPC on the ledger files under ``root`` while :attr:`full` (see the module
    docstring). ``where``: "append" (entry writes and new files fail) or "rollover" (only
    new files fail: the ledger being written has room until it is full)."""

    def __init__(self, root: Path, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = str(root)
        self.where = where
        self.full = False
        self.refused = 0
        write_at, create = FileEntryLog._write_at, FileLogStorage.create
        disk = self

        def short_write(log: FileEntryLog, data: bytes, offset: int) -> None:
            if disk.bites(str(log.path)) and where == "append":
                write_at(log, data[: len(data) // 2], offset)  # what fitted
                disk.refuse()
            write_at(log, data, offset)

        def no_new_file(storage: FileLogStorage, name: str, ledger_id: int) -> FileEntryLog:
            if disk.bites(str(storage.path(name, ledger_id))):
                disk.refuse()
            return create(storage, name, ledger_id)

        monkeypatch.setattr(FileEntryLog, "_write_at", short_write)
        monkeypatch.setattr(FileLogStorage, "create", no_new_file)

    def bites(self, path: str) -> bool:
        return self.full and path.startswith(self.root)

    def refuse(self) -> None:
        self.refused += 1
        raise OSError(errno.ENOSPC, "No space left on device")


def assert_full_disk(error: BaseException) -> None:
    """``error`` is the retriable refusal of a full disk: ``ServiceNotReady`` saying so,
    or a send's ``Timeout`` naming it as its last trouble (the broker hung up on the
    producer before the refusal went out, and the producer's reconnections were refused
    while the disk stayed full)."""
    said = "ServiceNotReady: persistent://acme/disk/events: the data disk is full ([Errno 28]"
    assert isinstance(error, (ServerError, Timeout)), error
    if isinstance(error, Timeout):
        assert f"last trouble: reconnecting: {said}" in str(error), error
        return
    assert error.name is ErrorName.SERVICE_NOT_READY, error
    assert error.category is ErrorCategory.RETRIABLE
    assert said in str(error), error


@pytest.fixture(params=["append", "rollover"])
def where(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_full_disk_refuses_sends_retriably_and_recovers_by_itself(
    start_broker: StartBroker, tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker: BrokerServer = await start_broker(
        broker_id="full", ledger=LedgerSettings(max_ledger_bytes=4096)
    )
    disk = FullDisk(tmp_path / "full", where, monkeypatch)
    topic = "persistent://acme/disk/events"
    async with Client(broker.settings.advertise_url) as client:
        await client.admin.create_topic(topic)
        consumer = await client.subscribe(topic, "audit", initial_position="earliest")
        producer = await client.create_producer(topic, send_timeout_s=2)
        acked = [await producer.send(f"before-{i}".encode()) for i in range(5)]

        disk.full = True
        refusals: list[ServerError | Timeout] = []
        sent = 0
        while not refusals:  # "rollover": it bites once the ledger is full (within 4 KiB)
            assert sent < 100, "the full disk was never met"
            try:
                acked.append(await producer.send(f"before-{len(acked)}".encode() * 20))
            except (ServerError, Timeout) as e:
                refusals.append(e)
            sent += 1
        assert_full_disk(refusals[0])
        # still full: the next send is not stored, and says why within its send timeout
        with pytest.raises((ServerError, Timeout)) as later:
            await producer.send(b"while full")
        assert_full_disk(later.value)

        disk.full = False  # room again: the same producer's sends are stored, no restart

        async def stored() -> bool:
            try:
                acked.append(await producer.send(b"after"))
            except (ServerError, Timeout) as e:
                assert isinstance(e, Timeout) or e.category is ErrorCategory.RETRIABLE, e
                return False
            return True

        await wait_until(stored, timeout=15, what="a send stored once the disk has room")

        got: list[
            MessageId
        ] = []  # (a refused send may be stored after all: it is not acknowledged)
        while not set(acked) <= set(got):
            message = await consumer.receive(timeout_s=10)
            await consumer.acknowledge(message)
            got.append(message.message_id)
        assert len(set(got)) == len(got)  # nothing twice
        assert [m for m in got if m in set(acked)] == acked  # every acknowledged one, in order
    assert disk.refused


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
async def test_a_transaction_that_met_a_full_disk_does_not_commit_its_writes(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    words, shouted = "topic://acme/disk/words", "topic://acme/disk/shouted"
    async with Client(cluster.url) as client:
        for topic in (words, shouted):
            await client.admin.create_topic(topic)
        inputs = await client.subscribe(words, "shouter", initial_position="earliest")
        outputs = await client.subscribe(shouted, "reader", initial_position="earliest")
        feeder = await client.create_producer(words)
        for i in range(6):
            await feeder.send(f"w{i}".encode(), key=f"k{i}")
        shouter = await client.create_producer(shouted, send_timeout_s=2)
        committed: list[bytes] = []

        async def transform(n: int) -> None:
            """Read ``n`` words and write them shouted in one transaction."""
            batch = [await inputs.receive(timeout_s=10) for _ in range(n)]
            async with client.transaction(timeout_s=30) as txn:
                for message in batch:
                    await shouter.send(message.value.upper(), key=message.key, txn=txn)
                    await inputs.acknowledge(message, txn=txn)
            committed.extend(m.value.upper() for m in batch)

        await transform(2)
        disk = FullDisk(tmp_path / "ledgers", "append", monkeypatch)
        disk.full = True
        with pytest.raises((ServerError, Timeout)) as refused:
            await transform(2)  # aborted: its inputs come again
        assert "the data disk is full ([Errno 28] No space left on device)" in str(refused.value)

        disk.full = False

        async def transformed() -> bool:
            try:
                await transform(2)
            except (ServerError, Timeout) as e:
                assert isinstance(e, Timeout) or e.category is not ErrorCategory.FATAL, e
                return False
            return True

        await wait_until(transformed, timeout=20, what="a transaction committed with room")
        while len(committed) < 6:
            await transform(2)
        got = [(await outputs.receive(timeout_s=10)).value for _ in range(6)]
        assert sorted(got) == sorted(committed) == [f"W{i}".encode() for i in range(6)]
        with pytest.raises(Timeout):  # nothing of the aborted transaction, nothing twice
            await outputs.receive(timeout_s=0.5)
    assert disk.refused


@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
async def test_a_send_waiting_for_its_segment_on_a_full_disk_says_why_it_gave_up(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment whose broker cannot open it (its reopen needs a new ledger file) refuses
    producers while the disk is full; a send waiting for its segment's producer used to
    give up saying only that it waited. Its Timeout names the refusal."""
    topic = "topic://acme/disk/fresh"
    async with Client(cluster.url) as client:
        await client.admin.create_topic(topic, segments=1)
        await cluster.broker.service.unload(TopicName.parse(topic).segment_name(0))
        disk = FullDisk(tmp_path / "ledgers", "append", monkeypatch)
        disk.full = True
        producer = await client.create_producer(topic, send_timeout_s=2)
        with pytest.raises(Timeout) as gave_up:
            await producer.send(b"while full", key="k")
        said = str(gave_up.value)
        assert "for its segment's producer: last trouble: connecting: ServiceNotReady" in said
        assert "the data disk is full ([Errno 28] No space left on device)" in said
        assert gave_up.value.category is ErrorCategory.RETRIABLE  # nothing was sent
        disk.full = False
        await producer.send(b"with room", key="k")  # the next send connects
