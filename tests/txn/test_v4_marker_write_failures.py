"""END_TXN_ON_PARTITION whose marker the topic's ledger cannot write (docs/transactions.md,
v4 participants) answers a typed error, as END_TXN_ON_SUBSCRIPTION does when its cursor
cannot be saved: ``ServiceNotReady`` where the topic is moving (the ledger's next file is
held by another writer: a broker that took the topic over), which the coordinator retries;
``PersistenceError`` naming the cause where the broker's storage is in trouble (a file at
the next ledger id holding data the ledger's metadata does not know, named by its path; a
write the disk refused). Each was an internal error: ``UnknownError`` with an incident id,
its cause only in the broker's log, and the coordinator could not tell it from a bug. Once
the cause is gone, the same END writes the marker, and the transaction commits.

Real components: the test cluster on the memory store, its broker restarted with ledgers of
one entry (every append rolls over, so the marker's write makes the next ledger's file),
faults at the file layer (as tests/broker/test_disk_full.py injects a full disk).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from segtxn.broker.app import BrokerServer
from segtxn.client import Client
from segtxn.ledger import LedgerSettings
from segtxn.ledger.files import FileEntryLog, FileLogStorage
from segtxn.ledger.metadata import decode, metadata_key
from segtxn.protocol.errors import ErrorName, ServerError, ServiceNotReady
from segtxn.protocol.names import TopicName
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "persistent://acme/v4-markers/t"
NAME = TopicName.parse(TOPIC)


async def _one_entry_ledgers(cluster: Cluster) -> None:
    """Restart the cluster's broker with ledgers of one entry."""
    settings = dataclasses.replace(
        cluster.broker.settings, ledger=LedgerSettings(max_ledger_bytes=1)
    )
    await cluster.broker.stop()
    cluster.broker = BrokerServer(settings, store=cluster.store)
    await cluster.broker.start()


@contextlib.contextmanager
def _marker_write_fails(
    kind: str, storage: FileLogStorage, ledger_id: int, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """While inside, the write of the topic's ledger ``ledger_id`` (the marker's) fails as
    ``kind`` says; yields that ledger's file."""
    path = storage.path(TOPIC, ledger_id)
    if kind == "io-error":
        write_at = FileEntryLog._write_at

        def refused(log: FileEntryLog, data: bytes, offset: int) -> None:
            if log.path == path:
                raise OSError(errno.EIO, "Input/output error")
            write_at(log, data, offset)

        with monkeypatch.context() as patch:
            patch.setattr(FileEntryLog, "_write_at", refused)
            yield path
        return
    stranger = storage.create(TOPIC, ledger_id)  # holds the file's lock while open
    try:
        if kind == "foreign-file":  # data the ledger's metadata does not know, let go
            stranger.append_batch([b"not this ledger's"])
            stranger.close()
        yield path
    finally:
        stranger.close()
        if kind == "foreign-file":
            path.unlink()  # the operator's remedy (it was another's: moved away)


FAULTS = {
    "held-by-another-writer": (ErrorName.SERVICE_NOT_READY, "held by another writer"),
    "foreign-file": (ErrorName.PERSISTENCE, "{path} already holds data"),
    "io-error": (ErrorName.PERSISTENCE, "Input/output error"),
}
"""Each fault, the answer to the END it fails, and what that answer says (of the file)."""


@pytest.mark.parametrize("kind", list(FAULTS))
@pytest.mark.parametrize("cluster", ["memory"], indirect=True)
async def test_a_marker_the_ledger_cannot_write_is_refused_by_name(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    answer, says = FAULTS[kind]
    await _one_entry_ledgers(cluster)
    storage = cluster.broker.service.storage
    assert isinstance(storage, FileLogStorage)
    async with Client(cluster.url) as client:
        await client.admin.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        producer = await client.create_producer(TOPIC)
        txn = client.transaction()
        await producer.send(b"x", txn=txn)
        record = await cluster.store.get(metadata_key(TOPIC))
        assert record is not None
        end = f"{cluster.url}/admin/v2/{NAME.path}/txn/{txn.id}/end"  # as the coordinator

        next_id = decode(record.value).next_ledger_id
        with (
            _marker_write_fails(kind, storage, next_id, monkeypatch) as path,
            pytest.raises(ServerError) as refused,
        ):
            await client.connector.request("POST", end, params={"action": "COMMIT"})
        assert refused.value.name is answer, refused.value
        assert says.format(path=path) in refused.value.message
        assert f"{TOPIC}: the COMMIT marker of {txn.id} could not be written" in (
            refused.value.message
        )
        assert "incident" not in caplog.text  # no internal error, nothing to look up

        await cluster.broker.service.unload(NAME)  # (a refusal by damage keeps it loaded)

        async def ended() -> bool:  # the same END again, retried as the coordinator does
            try:
                await client.connector.request("POST", end, params={"action": "COMMIT"})
            except ServiceNotReady:  # (still being unloaded)
                return False
            return True

        await wait_until(ended, what="the same END, once the cause is gone")
        await txn.commit()  # the coordinator's own END finds it ended
        message = await consumer.receive(timeout_s=10)
        assert message.value == b"x"
