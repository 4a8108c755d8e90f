"""One exception class per wire error name, with its category, raised by the client against
a real broker and coordinator (the ``cluster`` fixture), and still a ``ServerError`` with a
``.name`` for the code that branches on that."""

from __future__ import annotations

import pickle

import aiohttp
import pytest

import segtxn.client
from segtxn.client import (
    Client,
    ErrorCategory,
    ErrorName,
    InvalidTopicName,
    InvalidTxnStatus,
    ServerError,
    ServiceNotReady,
    TopicAlreadyExists,
    TopicNotFound,
    TransactionNotFound,
    errors,
)
from segtxn.client.coordinators import Coordinators
from segtxn.metastore.etcd_server import free_port
from segtxn.protocol import names
from segtxn.protocol.errors import NamedServerError, server_error
from tests.cluster import Cluster

CATEGORIES = {
    ErrorName.SERVICE_NOT_READY: ErrorCategory.RETRIABLE,
    ErrorName.NOT_OWNER: ErrorCategory.RETRIABLE,
    ErrorName.TOO_MANY_REQUESTS: ErrorCategory.RETRIABLE,
    ErrorName.METADATA_STORE_FULL: ErrorCategory.RETRIABLE,
    ErrorName.TRANSACTION_CONFLICT: ErrorCategory.ABORTABLE,
    ErrorName.INVALID_TXN_STATUS: ErrorCategory.ABORTABLE,
    ErrorName.TRANSACTION_NOT_FOUND: ErrorCategory.ABORTABLE,
}
"""The names that are not FATAL (docs/protocol.md's table says the same)."""


@pytest.mark.parametrize("name", list(ErrorName))
def test_every_name_has_its_own_class(name: ErrorName) -> None:
    error = server_error(
        name, "why", redirect="http://b2:8080" if name is ErrorName.NOT_OWNER else None
    )
    cls = type(error)
    assert cls.__name__ == name.value  # `except TopicNotFound` reads as the wire name
    assert issubclass(cls, ServerError) and cls is not ServerError
    assert error.name is name and cls.name is name
    assert error.message == "why" and str(error) == f"{name.value}: why"
    assert error.category is CATEGORIES.get(name, ErrorCategory.FATAL)
    assert error.retriable is (error.category is ErrorCategory.RETRIABLE)
    assert getattr(segtxn.client, name.value) is cls  # importable from the client
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls and str(copy) == str(error)


def test_a_name_has_one_class() -> None:
    with pytest.raises(TypeError, match="TopicNotFound already has a class"):

        class Again(NamedServerError):
            name = ErrorName.TOPIC_NOT_FOUND


def test_the_client_exports_what_its_modules_list() -> None:
    assert set(errors.__all__) <= set(segtxn.client.__all__)
    for exported in segtxn.client.__all__:
        assert hasattr(segtxn.client, exported), exported


async def test_a_broker_refusal_is_its_class(client: Client) -> None:
    with pytest.raises(TopicNotFound) as missing:
        await client.admin.stats("topic://t/ns/missing")
    assert missing.value.name is ErrorName.TOPIC_NOT_FOUND  # the old way keeps working
    assert missing.value.category is ErrorCategory.FATAL

    await client.admin.create_topic("topic://t/ns/twice")
    with pytest.raises(ServerError) as again:  # `except ServerError` still catches it
        await client.admin.create_topic("topic://t/ns/twice")
    assert isinstance(again.value, TopicAlreadyExists)


async def test_a_bad_name_is_refused_before_sending(client: Client) -> None:
    with pytest.raises(InvalidTopicName) as refused:
        await client.create_producer("topic://t/ns")
    assert isinstance(refused.value.__cause__, names.InvalidTopicName)  # the parser's error


async def test_transaction_errors_are_abortable(cluster: Cluster, client: Client) -> None:
    with pytest.raises(TransactionNotFound) as unknown:
        await Coordinators(client.connector).call("GET", "/txn/v2/1000000000000:ffff")
    assert unknown.value.category is ErrorCategory.ABORTABLE

    txn = await client.transaction(timeout_s=300).start()
    await Coordinators(client.connector).call(
        "POST", f"/txn/v2/{txn.id}/end", params={"action": "ABORT"}
    )
    with pytest.raises(InvalidTxnStatus) as ended:  # aborted behind its back
        await txn.commit()
    assert ended.value.category is ErrorCategory.ABORTABLE
    assert await txn.status() == "ABORTED"


async def test_no_broker_is_service_not_ready_from_the_refusal() -> None:
    async with Client(f"http://127.0.0.1:{free_port()}", operation_timeout_s=2) as client:
        with pytest.raises(ServiceNotReady) as refused:
            await client.admin.stats("topic://t/ns/x")
    assert refused.value.retriable
    assert isinstance(refused.value.__cause__, aiohttp.ClientConnectorError)
