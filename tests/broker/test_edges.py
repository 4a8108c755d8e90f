"""What a tester saw at the edges of the admin and coordinator REST APIs (issue 15), and the
answers now: each case is the documented JSON error (or a refusal where input used to be
accepted silently), nothing reaches the log at ERROR or with a traceback, and the servers
go on serving. On the embedded store and on etcd (tests/cluster.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import yarl

from segtxn.client import Client, ServerError
from segtxn.coordinator.app import V4
from segtxn.protocol.errors import ErrorName
from segtxn.protocol.hashing import key_hash
from tests.cluster import Cluster
from tests.waiting import wait_until

TOPIC = "persistent://acme/edges/t"
PATH = "/admin/v2/persistent/acme/edges/t"


async def coordinator_ready(cluster: Cluster) -> None:
    """Both v4 ids held: a coordinator stopped while it is still taking them over leaks the
    log's writer (a shutdown race of the v4 coordinator, not what these tests are about)."""
    v4 = cluster.coordinator.app[V4]
    await wait_until(lambda: len(v4.held) == v4.settings.v4_coordinator_ids, what="v4 ids")


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[Client]:
    """A client of the cluster's broker (tests/broker/conftest.py's is of another broker)."""
    async with Client(cluster.url) as c:
        yield c


@pytest.fixture
async def http(cluster: Cluster, client: Client) -> AsyncIterator[aiohttp.ClientSession]:
    await coordinator_ready(cluster)
    await client.admin.create_topic(TOPIC)
    await client.admin.create_subscription(TOPIC, "sub")
    await (await client.create_producer(TOPIC)).send(b"one")
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(autouse=True)
def clean_log(caplog: pytest.LogCaptureFixture) -> Any:
    """No record at ERROR and no traceback: these are all the client's mistakes (read from
    every phase's records: after the ``yield``, ``caplog.records`` holds only the
    teardown's)."""
    caplog.set_level(logging.INFO)
    yield
    records = [*caplog.get_records("setup"), *caplog.get_records("call"), *caplog.records]
    bad = [r for r in records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]


async def answer(
    http: aiohttp.ClientSession, method: str, url: str | yarl.URL, **kwargs: Any
) -> tuple[int, str, str]:
    """(status, error name, message) of a request that must fail with the JSON error."""
    async with http.request(method, url, allow_redirects=False, **kwargs) as response:
        assert response.content_type == "application/json", await response.text()
        body = await response.json()
        assert response.headers["X-Segtxn-Error"] == body["error"]
        assert "Traceback" not in body["message"]
        return response.status, body["error"], body["message"]


def coordinator(cluster: Cluster) -> str:
    return cluster.coordinator.settings.advertise_url


# ---------------------------------------------------------------------- 500s before


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        b"[" * 33 + b"]" * 33,
    ],
    ids=["deep-array", "deep-object", "33-levels"],
)
async def test_deeply_nested_json_is_invalid_argument(
    cluster: Cluster, http: aiohttp.ClientSession, body: bytes
) -> None:
    for url in (f"{cluster.url}{PATH}/properties", f"{coordinator(cluster)}/txn/v2/0:1/partitions"):
        method = "PUT" if "admin" in url else "POST"
        status, name, message = await answer(http, method, url, data=body)
        assert (status, name) == (400, ErrorName.INVALID_ARGUMENT)
        assert "deeper than 32" in message


@pytest.mark.parametrize("body", [b'{"k": "\\ud800"}', b'{"\\udfff": "v"}'])
async def test_a_lone_surrogate_is_invalid_argument(
    cluster: Cluster, http: aiohttp.ClientSession, body: bytes
) -> None:
    status, name, message = await answer(http, "PUT", f"{cluster.url}{PATH}/properties", data=body)
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT)
    assert "lone surrogate" in message


@pytest.mark.parametrize("limit", ["9" * 40, "99999999999", "0", "-1", "\u00b2", "1_0", ""])
async def test_a_limit_out_of_range_is_invalid_argument(
    cluster: Cluster, http: aiohttp.ClientSession, limit: str
) -> None:
    url = f"{coordinator(cluster)}/txn/v2/open"
    status, name, _ = await answer(http, "GET", url, params={"limit": limit})
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT)


@pytest.mark.parametrize("given", ["1_0", " 7", "nan", "inf", "\u0661", "", "1e999", "-5"])
async def test_a_new_txn_timeout_that_is_not_a_plain_number_in_range_is_invalid_argument(
    cluster: Cluster, http: aiohttp.ClientSession, given: str
) -> None:
    url = f"{coordinator(cluster)}/txn/v2/new"
    status, name, _ = await answer(http, "POST", url, params={"timeout_s": given})
    assert (status, name) == (400, ErrorName.INVALID_ARGUMENT)


async def test_a_new_txn_timeout_as_python_writes_a_float_is_taken(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    for timeout in ("60", "0.5", str(0.00001)):  # the last one is "1e-05"
        async with http.post(
            f"{coordinator(cluster)}/txn/v2/new", params={"timeout_s": timeout}
        ) as response:
            assert response.status == 200, await response.text()


@pytest.mark.parametrize(
    "name",
    [
        f"persistent/{'x' * 128}/{'x' * 128}/{'x' * 128}",
        f"topic/{'x' * 128}/{'x' * 128}/{'x' * 128}",
        f"persistent/{'t' * 64}/{'n' * 64}/{'l' * 13}",
    ],
    ids=["persistent-128x3", "topic-128x3", "141-together"],
)
async def test_names_longer_than_the_layers_hold_are_refused_up_front(
    cluster: Cluster, http: aiohttp.ClientSession, name: str
) -> None:
    for method, suffix in [("PUT", ""), ("GET", "/stats"), ("DELETE", ""), ("POST", "/load")]:
        url = f"{cluster.url}/admin/v2/{name}{suffix}"
        status, error, message = await answer(http, method, url)
        assert (status, error) == (400, ErrorName.INVALID_TOPIC_NAME), message
        assert "at most" in message and len(message) < 400  # the name is not echoed whole


@pytest.mark.parametrize(
    ("body", "status", "name"),
    [
        (json.dumps({"k": "x" * (3 << 20)}).encode(), 413, ErrorName.MESSAGE_TOO_LARGE),
        (json.dumps({"k": "x" * (1600 << 10)}).encode(), 413, ErrorName.MESSAGE_TOO_LARGE),
        (json.dumps({"k": "x" * (200 << 10)}).encode(), 400, ErrorName.INVALID_ARGUMENT),
        (json.dumps({f"k{i}": "v" for i in range(20_000)}).encode(), 400, "InvalidArgument"),
        (json.dumps({f"k{i}": "v" * 8000 for i in range(9)}).encode(), 400, "InvalidArgument"),
    ],
    ids=["3MiB", "over-etcd-request", "200KiB-value", "20000-keys", "over-64KiB-together"],
)
async def test_bodies_and_records_beyond_the_store_are_refused(
    cluster: Cluster, http: aiohttp.ClientSession, body: bytes, status: int, name: str
) -> None:
    for path in (PATH, "/admin/v2/topic/acme/edges/s"):
        got = await answer(http, "PUT", f"{cluster.url}{path}/properties", data=body)
        assert got[:2] == (status, name), got
    async with http.get(f"{cluster.url}{PATH}/properties") as response:  # still serving
        assert response.status == 200 and await response.json() == {
            "__contains_txn_messages": "false"
        }


@pytest.mark.parametrize(
    "kwargs",
    [{"headers": {"X-Big": "h" * 100_000}}, {"params": {"q": "x" * 20_000}}],
    ids=["100KB-header", "20KB-query"],
)
async def test_oversized_headers_and_query_strings_are_431(
    cluster: Cluster, http: aiohttp.ClientSession, kwargs: dict[str, Any]
) -> None:
    for base in (cluster.url, coordinator(cluster)):
        status, name, message = await answer(http, "GET", f"{base}/healthz", **kwargs)
        assert (status, name) == (431, ErrorName.INVALID_ARGUMENT)
        assert "8190 bytes" in message


# ---------------------------------------------------------------------- accepted silently before


async def test_a_property_with_an_empty_key_is_invalid_argument(
    client: Client, cluster: Cluster
) -> None:
    await coordinator_ready(cluster)
    await client.admin.create_topic(TOPIC)
    with pytest.raises(ServerError) as error:
        await client.admin.update_properties(TOPIC, {"": "v"})
    assert error.value.name is ErrorName.INVALID_ARGUMENT
    assert "empty" in error.value.message
    assert await client.admin.properties(TOPIC) == {"__contains_txn_messages": "false"}


@pytest.mark.parametrize("to", ["-5:-7", "-1:0", "1:-1", "9" * 30 + ":1", "99999:0", "1:999"])
async def test_a_reset_to_a_negative_or_far_position_is_invalid_argument(
    client: Client, http: aiohttp.ClientSession, to: str
) -> None:
    with pytest.raises(ServerError) as error:
        await client.admin.reset_subscription(TOPIC, "sub", to)
    assert error.value.name is ErrorName.INVALID_ARGUMENT, error.value
    stats = await client.admin.stats(TOPIC)
    assert stats["subscriptions"]["sub"]["backlog"] == 1  # nothing was skipped


async def test_reset_and_property_refusals_say_what_is_wanted(
    client: Client, cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    url = f"{cluster.url}{PATH}"
    _, _, message = await answer(http, "POST", f"{url}/subscription/sub/reset")
    assert message == "to: earliest, latest or LEDGER:ENTRY?"
    await client.admin.create_topic("topic://acme/edges/s")
    scalable = f"{cluster.url}/admin/v2/topic/acme/edges/s"
    await client.admin.create_subscription("topic://acme/edges/s", "sub")
    _, _, message = await answer(http, "POST", f"{scalable}/subscription/sub/reset?to=1:0")
    assert message.startswith("to: a scalable topic resets to earliest or latest, not '1:0'")
    _, _, message = await answer(http, "PUT", f"{url}/properties", json={"ok": "v", "n": 7})
    assert message == "properties are a JSON object of strings: 'n' is a number"


async def test_a_reset_to_the_next_position_is_fine(client: Client, http: Any) -> None:
    stats = await client.admin.stats(TOPIC)
    ledger = stats["lastConfirmedPosition"].split(":")[0]
    await client.admin.reset_subscription(TOPIC, "sub", f"{ledger}:1")  # just past the end
    assert (await client.admin.stats(TOPIC))["subscriptions"]["sub"]["backlog"] == 0
    await client.admin.reset_subscription(TOPIC, "sub", f"{ledger}:0")
    assert (await client.admin.stats(TOPIC))["subscriptions"]["sub"]["backlog"] == 1


@pytest.mark.parametrize(
    ("raw", "status", "name"),
    [
        ("/admin/v2/persistent/../edges", 400, ErrorName.INVALID_TOPIC_NAME),
        ("/admin/v2/persistent/acme/..", 400, ErrorName.INVALID_TOPIC_NAME),
        ("/admin/v2/persistent/%2E%2E/edges", 400, ErrorName.INVALID_TOPIC_NAME),
        ("/admin/v2/persistent/a%20b/edges", 400, ErrorName.INVALID_TOPIC_NAME),
        ("/admin/v2/persistent/-x/edges", 400, ErrorName.INVALID_TOPIC_NAME),
        ("/admin/v2/persistent/acme/...", 400, ErrorName.INVALID_TOPIC_NAME),
        ("/admin/v2/segment/acme/edges", 400, ErrorName.INVALID_TOPIC_NAME),
        (f"/admin/v2/persistent/{'t' * 65}/edges", 400, ErrorName.INVALID_TOPIC_NAME),
    ],
)
async def test_invalid_parts_of_a_list_path_are_refused(
    cluster: Cluster, http: aiohttp.ClientSession, raw: str, status: int, name: str
) -> None:
    url = yarl.URL(cluster.url + raw, encoded=True)
    got = await answer(http, "GET", url)  # sent as written: aiohttp's client resolves '..'
    assert got[:2] == (status, name), got


async def test_the_client_refuses_a_namespace_no_topic_can_have(
    client: Client, cluster: Cluster
) -> None:
    await coordinator_ready(cluster)
    for tenant, namespace in [("..", "ns"), ("acme", ".."), ("a b", "ns"), ("acme", "")]:
        with pytest.raises(ServerError) as error:
            await client.admin.list_topics("persistent", tenant, namespace)
        assert error.value.name is ErrorName.INVALID_TOPIC_NAME


async def test_segments_for_a_persistent_topic_is_invalid_argument(
    client: Client, cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    for segments in (1, 4):
        with pytest.raises(ServerError) as error:
            await client.admin.create_topic("persistent://acme/edges/p", segments=segments)
        assert error.value.name is ErrorName.INVALID_ARGUMENT
        assert "only scalable topics" in error.value.message
    assert await client.admin.list_topics("persistent", "acme", "edges") == [TOPIC]
    url = f"{cluster.url}/admin/v2/persistent/acme/edges/p"
    assert (await answer(http, "PUT", url, params={"segments": "1"}))[0] == 400
    for text in ("0", "257", "\u00b2", "-1", "1.5"):
        url = f"{cluster.url}/admin/v2/topic/acme/edges/s"
        status, name, _ = await answer(http, "PUT", url, params={"segments": text})
        assert (status, name) == (400, ErrorName.INVALID_ARGUMENT)


# ---------------------------------------------------------------------- unclear before


@pytest.mark.parametrize("server", ["broker", "coordinator"])
async def test_unknown_paths_and_methods_get_the_json_error(
    cluster: Cluster, http: aiohttp.ClientSession, server: str
) -> None:
    base = cluster.url if server == "broker" else coordinator(cluster)
    known = PATH if server == "broker" else "/txn/v2/new"
    status, name, message = await answer(http, "PATCH", base + known)
    assert (status, name) == (405, ErrorName.NOT_ALLOWED)
    assert "PATCH is not allowed" in message and "allowed: " in message
    status, name, message = await answer(http, "GET", base + "/no/such/thing")
    assert (status, name) == (404, ErrorName.INVALID_ARGUMENT)
    assert message == "no such endpoint: GET /no/such/thing"
    # the other kind of server's path: where it is served
    other = "/txn/v2/new" if server == "broker" else "/admin/v2/persistent/acme/edges"
    status, name, message = await answer(http, "GET", base + other)
    assert (status, name) == (404, ErrorName.INVALID_ARGUMENT), message
    assert message.startswith(f"no such endpoint: GET {other}: this is a "), message
    assert message.endswith(
        "served by the transaction coordinators"
        if server == "broker"
        else "topics are served by the brokers"
    ), message


@pytest.mark.parametrize("server", ["broker", "coordinator"])
async def test_a_client_gone_mid_body_is_not_a_server_error(
    cluster: Cluster, server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """It promised 100 bytes, sent 2 and closed: the server's read fails, which is the
    client's doing (no incident, no traceback: the autouse check)."""
    await coordinator_ready(cluster)
    url = yarl.URL(cluster.url if server == "broker" else coordinator(cluster))
    method, path = (
        ("PUT", f"/admin/v2/{TOPIC.replace('://', '/')}/properties")
        if server == "broker"
        else ("POST", "/txn/v2/0:1/partitions")
    )
    assert url.host is not None and url.port is not None
    caplog.set_level(logging.DEBUG, logger="segtxn.boundary")
    _, writer = await asyncio.open_connection(url.host, url.port)
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n{}".encode()
    )
    await writer.drain()
    writer.close()
    await wait_until(
        lambda: any("went away mid-request" in r.getMessage() for r in caplog.records),
        what="the server saw the client go",
    )


@pytest.mark.parametrize("server", ["broker", "coordinator"])
async def test_malformed_http_gets_the_json_error(cluster: Cluster, server: str) -> None:
    await coordinator_ready(cluster)
    url = yarl.URL(cluster.url if server == "broker" else coordinator(cluster))
    assert url.host is not None and url.port is not None
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n")
        answer_bytes = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = answer_bytes.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") or head.startswith(b"HTTP/1.0 400"), head
    assert json.loads(body)["error"] == ErrorName.INVALID_ARGUMENT


SCALABLE = "topic://acme/edges/s"


async def test_split_takes_only_plain_numbers(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession
) -> None:
    """``segment`` and ``at`` of a split were read with ``int()``: a fullwidth zero, ``1_0``,
    ``+0`` or `` 16`` split something the caller did not write. Now they are refused, and
    the topic is left as it was; decimal and ``0x`` hex hashes still split."""
    await client.admin.create_topic(SCALABLE, segments=1)
    url = f"{cluster.url}/admin/v2/topic/acme/edges/s/split"
    refused = [
        ({"segment": "\uff10"}, "segment: '\uff10' is not a number"),  # was segment 0
        ({"segment": "+0"}, "segment: '+0' is not a number"),
        ({"segment": "0_0"}, "segment: '0_0' is not a number"),
        ({"segment": "0", "at": "1_0"}, "at: '1_0' is not a number"),  # was hash 10
        ({"segment": "0", "at": " 16"}, "at: ' 16' is not a number"),
        ({"segment": "0", "at": "\u0661\u0660"}, "is not a number"),  # Arabic-Indic 10
        ({"segment": "0", "at": "0x_10"}, "at: '0x_10' is not a hash"),
        ({"segment": "0", "at": "0o17"}, "at: '0o17' is not a number"),
        ({"segment": "0", "at": "-5"}, "at must be in 0..65535, not -5"),  # was -0x005
        ({"segment": "0", "at": "65536"}, "at must be in 0..65535, not 65536"),
        ({"segment": "0", "at": "0x10000"}, "at: '0x10000' is not a hash"),
    ]
    for params, expected in refused:
        status, name, message = await answer(http, "POST", url, params=params)
        assert (status, name) == (400, ErrorName.INVALID_ARGUMENT), (params, message)
        assert expected in message, (params, message)
    assert (await client.admin.stats(SCALABLE))["epoch"] == 0  # nothing was split

    dag = await client.admin.split(SCALABLE, 0, at=0x4000)  # the client sends decimal
    assert [s["range"] for s in dag["segments"] if s["state"] == "ACTIVE"] == [
        [0, 0x3FFF],
        [0x4000, 0xFFFF],
    ]
    async with http.post(url, params={"segment": "2", "at": "0xC000"}) as response:
        assert response.status == 200, await response.text()
        dag = await response.json()
    assert [s["range"] for s in dag["segments"] if s["state"] == "ACTIVE"] == [
        [0, 0x3FFF],
        [0x4000, 0xBFFF],
        [0xC000, 0xFFFF],
    ]


async def test_an_active_segment_is_sealed_only_by_a_split_or_merge(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession
) -> None:
    """``POST .../segment/.../terminate`` of an ACTIVE segment answered 200 and sealed its
    ledger while the DAG still said ACTIVE: every send of a key in its range then timed out.
    Now it is refused and the segment keeps taking writes; the controller's split still
    seals it (through the same call), and terminating a sealed segment again is harmless."""
    await client.admin.create_topic(SCALABLE, segments=2)
    low = next(k for k in (f"k{i}" for i in range(1000)) if key_hash(k) < 0x8000)  # segment 0
    producer = await client.create_producer(SCALABLE, send_timeout_s=10)
    await producer.send(b"before", key=low)
    segment = f"{cluster.url}/admin/v2/segment/acme/edges/s/0/terminate"
    status, name, message = await answer(http, "POST", segment)
    assert (status, name) == (405, ErrorName.NOT_ALLOWED), message
    assert "sealed only by a split or merge" in message
    assert "/admin/v2/topic/acme/edges/s/split?segment=0" in message
    assert not (await client.admin.stats("segment://acme/edges/s/0"))["sealed"]
    await producer.send(b"after", key=low)  # timed out for ever before

    status, name, message = await answer(
        http, "POST", f"{cluster.url}/admin/v2/topic/acme/edges/s/terminate"
    )
    assert (status, name) == (405, ErrorName.NOT_ALLOWED), message
    assert "terminating one is not supported" in message

    dag = await client.admin.split(SCALABLE, 0)  # its controller seals segment 0
    assert [s["state"] for s in dag["segments"]][:2] == ["SEALED", "ACTIVE"]
    await producer.send(b"split", key=low)  # to segment 0's child now
    async with http.post(segment) as response:  # sealed already: harmless
        assert response.status == 200, await response.text()
    stats = await client.admin.stats("segment://acme/edges/s/0")
    assert stats["sealed"] and stats["lastConfirmedPosition"].endswith(":1")  # both sends
    await producer.close()


async def test_force_is_true_or_false_and_nothing_else(
    cluster: Cluster, client: Client, http: aiohttp.ClientSession
) -> None:
    """``DELETE ...?force=yes`` (or ``1``, ``TRUE``, ``on``) counted as not forced, and the
    refusal for connected clients said nothing of the ``force`` it ignored. Now only
    ``true`` and ``false`` are taken, and anything else is refused, naming the parameter,
    before anything is deleted (on a scalable topic too)."""
    await client.admin.create_topic(SCALABLE, segments=2)
    consumers = [await client.subscribe(t, "sub") for t in (TOPIC, SCALABLE)]
    for path in (PATH, "/admin/v2/topic/acme/edges/s"):
        for given in ("yes", "1", "TRUE", "True", "on", "", "true "):
            status, name, message = await answer(
                http, "DELETE", f"{cluster.url}{path}", params={"force": given}
            )
            assert (status, name) == (400, ErrorName.INVALID_ARGUMENT), (given, message)
            assert message == f"force: {given!r} is not true or false"
        status, name, _ = await answer(
            http, "DELETE", f"{cluster.url}{path}", params={"force": "false"}
        )
        assert (status, name) == (409, ErrorName.CONSUMER_BUSY)
    assert await client.admin.list_topics("persistent", "acme", "edges") == [TOPIC]
    assert await client.admin.list_topics("topic", "acme", "edges") == [SCALABLE]
    for path in (PATH, "/admin/v2/topic/acme/edges/s"):
        async with http.delete(f"{cluster.url}{path}", params={"force": "true"}) as response:
            assert response.status == 204, await response.text()
    assert await client.admin.list_topics("topic", "acme", "edges") == []
    for consumer in consumers:
        await consumer.close()
