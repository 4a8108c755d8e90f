"""Property-based fuzzing of every admin (broker) and coordinator endpoint over real HTTP.

A real cluster in this process (tests/cluster.py: one broker and one coordinator on one
store, memory and etcd) gets requests whose paths, queries, bodies and methods hypothesis
draws: mostly well-formed around the limits (names at and past their lengths, numbers at and
past their ranges, property sets at and past their sizes), and plain garbage. Every answer
must be a success or the documented error (JSON ``{"error", "message"}``, the name's status,
the ``X-Segtxn-Error`` header; never a 5xx), and nothing may reach the server log at ERROR or
with a traceback. After the cases the servers still serve and the data stored before reads
back unchanged (tests/fuzz/conftest.py). ``SEGTXN_FUZZ_SCALE`` makes the run longer.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import yarl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segtxn.client import Client
from segtxn.protocol import frames
from segtxn.protocol.errors import ErrorName
from tests.cluster import Cluster
from tests.fuzz.conftest import Guarded, ServerLog, examples
from tests.fuzz.tally import TALLY
from tests.fuzz.values import (
    ADD_BODY,
    ANY_VALUE,
    BODY,
    DOMAIN,
    KNOWN_TOPICS,
    LONG_PART,
    METHOD,
    NUMBER,
    PART,
    POSITION,
    SUB64,
    SUBSCRIPTION,
    WORD,
    query,
    topic_path,
    txn_id,
)
from tests.wsframes import next_frame

KNOWN_ERRORS = {e.value for e in ErrorName}
REFUSALS = {  # aiohttp's own refusals keep their HTTP status (docs/protocol.md)
    (400, ErrorName.INVALID_ARGUMENT),
    (404, ErrorName.INVALID_ARGUMENT),
    (405, ErrorName.NOT_ALLOWED),
    (413, ErrorName.MESSAGE_TOO_LARGE),
    (431, ErrorName.INVALID_ARGUMENT),
}

# ---------------------------------------------------------------------- the cluster's contents


@dataclass
class Known:
    """What the cluster holds when the fuzzing starts (created by the ``known`` fixture)."""

    txns: list[str] = field(default_factory=list)


@pytest.fixture
async def known(cluster: Cluster, guarded: Guarded) -> AsyncIterator[Known]:
    """Topics (some at every name limit), subscriptions, messages and open transactions
    for the fuzzed requests to find; after the fuzzing, the cluster still serves."""
    out = Known()
    async with Client(cluster.url) as client:
        for path in KNOWN_TOPICS:
            domain, rest = path.split("/", 1)
            if domain == "segment":
                continue
            topic = f"{domain}://{rest}"
            await client.admin.create_topic(topic, segments=2 if domain == "topic" else None)
            await client.admin.create_subscription(topic, SUB64, initial_position="earliest")
            producer = await client.create_producer(topic)
            for i in range(3):
                await producer.send(f"m{i}".encode(), key=f"k{i}")
            await producer.close()
        async with aiohttp.ClientSession() as http:
            coordinator = cluster.coordinator.settings.advertise_url
            for protocol in ("v5", "v5", "v4"):
                async with http.post(
                    f"{coordinator}/txn/v2/new", params={"timeout_s": "600", "protocol": protocol}
                ) as r:
                    out.txns.append((await r.json())["txnId"])
    yield out
    await _still_serves(cluster)


async def _still_serves(cluster: Cluster) -> None:
    """Both servers answer, and a new topic takes and gives back a message."""
    async with aiohttp.ClientSession() as http:
        for base in (cluster.url, cluster.coordinator.settings.advertise_url):
            async with http.get(f"{base}/healthz") as r:
                assert r.status == 200
    async with Client(cluster.url) as client:
        topic = f"persistent://after/fuzz/check-{uuid.uuid4().hex[:8]}"
        await client.admin.create_topic(topic)
        consumer = await client.subscribe(topic, "after")
        producer = await client.create_producer(topic)
        sent = await producer.send(b"still serving")
        message = await consumer.receive(timeout_s=10)
        assert message.message_id == sent and message.value == b"still serving"


# ---------------------------------------------------------------------- cases


@dataclass
class Case:
    kind: str
    """The class it counts under (endpoint group)."""
    method: str
    path: list[str]
    """Path segments (each URL-quoted when sent)."""
    params: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        def cut(value: object) -> str:
            text = repr(value)
            return text if len(text) < 300 else f"{text[:300]}... ({len(text)} chars)"

        path = cut("/" + "/".join(self.path))
        query, body, headers = cut(self.params), cut(self.body), cut(self.headers)
        return f"{self.kind}: {self.method} {path} {query} {body} {headers}"

    __repr__ = __str__


def _method(draw: st.DrawFn, right: str) -> str:
    """Mostly the endpoint's own method; now and then another one."""
    return right if draw(st.integers(0, 7)) else draw(METHOD)


@st.composite
def admin_case(draw: st.DrawFn, group: str) -> Case:
    """A request to one of the ``group``'s endpoints (ADMIN_GROUPS)."""
    topic = ["admin", "v2", *draw(topic_path())]
    sub = draw(SUBSCRIPTION)
    endpoints: list[tuple[str, str, list[str], dict[str, st.SearchStrategy[str]], bool]] = [
        ("topics", "PUT", topic, {"segments": NUMBER}, False),
        (
            "topics",
            "DELETE",
            topic,
            {
                "force": WORD,
                "ifProperty": ANY_VALUE,
                "ifPropertyValue": ANY_VALUE,
                "ifPropertyAbsent": WORD,
            },
            False,
        ),
        ("topics", "GET", [*topic, "stats"], {}, False),
        ("topics", "POST", [*topic, "terminate"], {}, False),
        ("topics", "POST", [*topic, "trim"], {}, False),
        ("topics", "POST", [*topic, "load"], {}, False),
        ("topics", "GET", ["admin", "v2", draw(DOMAIN), draw(PART), draw(PART)], {}, False),
        ("subscriptions", "GET", [*topic, "subscriptions"], {}, False),
        ("subscriptions", "PUT", [*topic, "subscription", sub], {"initial": WORD}, False),
        ("subscriptions", "DELETE", [*topic, "subscription", sub], {}, False),
        (
            "subscriptions",
            "POST",
            [*topic, "subscription", sub, "reset"],
            {"to": POSITION | WORD},
            False,
        ),
        ("properties", "GET", [*topic, "properties"], {}, False),
        ("properties", "PUT", [*topic, "properties"], {}, True),
        ("properties", "PUT", [*topic, "properties"], {}, True),
        ("properties", "DELETE", [*topic, "properties"], {"key": ANY_VALUE}, False),
        ("topology", "POST", [*topic, "split"], {"segment": NUMBER, "at": NUMBER}, False),
        ("topology", "POST", [*topic, "merge"], {"segments": ANY_VALUE}, False),
        ("v4-participant", "POST", [*topic, "txn", draw(txn_id([])), "end"], {}, False),
        (
            "v4-participant",
            "POST",
            [*topic, "subscription", sub, "txn", draw(txn_id([])), "end"],
            {"action": WORD},
            False,
        ),
        ("lookup", "GET", ["lookup", "v2", "topic", *topic[2:]], {}, False),
        ("lookup", "GET", ["lookup", "v2", "coordinators"], {}, False),
        ("lookup", "GET", ["ws", "v2", "lookup", *topic[2:]], {}, False),
        ("ws-handshake", "GET", ["ws", "v2", "producer", *topic[2:]], {"name": PART}, False),
        (
            "ws-handshake",
            "GET",
            ["ws", "v2", "consumer", *topic[2:], sub],
            {"type": WORD, "initial": WORD, "name": SUBSCRIPTION},
            False,
        ),
        (
            "ws-handshake",
            "GET",
            ["ws", "v2", "reader", *topic[2:]],
            {"start": POSITION | WORD, "end": POSITION | WORD},
            False,
        ),
        ("health", "GET", [draw(st.sampled_from(["healthz", "readyz", "metrics"]))], {}, False),
    ]
    mine = [e for e in endpoints if e[0] == group]
    kind, method, path, params, has_body = draw(st.sampled_from(mine))
    body = draw(BODY) if has_body or draw(st.integers(0, 9)) == 0 else None
    return Case(kind, _method(draw, method), path, draw(query(**params)), body)


@st.composite
def lifecycle(draw: st.DrawFn) -> list[Case]:
    """A topic's life in one go: create it (often with names at or past the length limits),
    use it, delete it. Every call must hold on every layer beneath: files, store keys."""
    domain = draw(st.sampled_from(["persistent", "topic"]))
    part = LONG_PART if draw(st.booleans()) else PART
    topic = ["admin", "v2", domain, draw(part), draw(part), draw(part)]
    sub = draw(SUBSCRIPTION)
    segments = {"segments": draw(st.sampled_from(["1", "3"]))} if domain == "topic" else {}
    calls = [
        Case("lifecycle", "PUT", topic, segments),
        Case("lifecycle", "POST", [*topic, "load"]),
        Case("lifecycle", "GET", [*topic, "stats"]),
        Case("lifecycle", "PUT", [*topic, "subscription", sub], {"initial": "earliest"}),
        Case("lifecycle", "WS", ["ws", "v2", "producer", *topic[2:]], {"name": "p"}),
        Case("lifecycle", "PUT", [*topic, "properties"], body=b'{"a": "b"}'),
        Case("lifecycle", "GET", ["lookup", "v2", "topic", *topic[2:]]),
        Case("lifecycle", "POST", [*topic, "trim"]),
        Case("lifecycle", "DELETE", [*topic, "subscription", sub]),
        Case("lifecycle", "DELETE", topic, {"force": "true"}),
    ]
    return calls


ADMIN_GROUPS = [
    "topics",
    "subscriptions",
    "properties",
    "topology",
    "v4-participant",
    "lookup",
    "ws-handshake",
    "health",
]
COORDINATOR_GROUPS = ["coord-new", "coord-list", "coord-add", "coord-end", "coord-status"]


@st.composite
def coordinator_case(draw: st.DrawFn, group: str, txns: list[str]) -> Case:
    """A request to one of the ``group``'s endpoints (COORDINATOR_GROUPS)."""
    txn = draw(txn_id(txns))
    endpoints: list[tuple[str, str, list[str], dict[str, st.SearchStrategy[str]], bool]] = [
        ("coord-new", "POST", ["new"], {"timeout_s": NUMBER, "protocol": WORD}, False),
        ("coord-list", "GET", ["open"], {"limit": NUMBER}, False),
        ("coord-list", "GET", ["stats"], {}, False),
        ("coord-add", "POST", [txn, "partitions"], {}, True),
        ("coord-add", "POST", [txn, "subscriptions"], {}, True),
        ("coord-end", "POST", [txn, "end"], {"action": WORD}, False),
        ("coord-status", "GET", [txn], {}, False),
    ]
    kind, method, path, params, has_body = draw(
        st.sampled_from([e for e in endpoints if e[0] == group])
    )
    body = draw(ADD_BODY) if has_body or draw(st.integers(0, 9)) == 0 else None
    if draw(st.integers(0, 15)) == 0:  # the health endpoints now and then
        kind, path, body = "coord-health", [draw(st.sampled_from(["healthz", "readyz"]))], None
        return Case(kind, _method(draw, "GET"), path)
    return Case(kind, _method(draw, method), ["txn", "v2", *path], draw(query(**params)), body)


# ---------------------------------------------------------------------- sending and judging


def _url(base: str, case: Case) -> yarl.URL:
    path = "/".join(quote(p, safe="", errors="surrogatepass") for p in case.path)
    text = f"{base}/{path}"
    if case.params:
        text += "?" + "&".join(
            f"{quote(k, errors='surrogatepass')}={quote(v, safe='', errors='surrogatepass')}"
            for k, v in case.params.items()
        )
    return yarl.URL(text, encoded=True)


async def send(http: aiohttp.ClientSession, base: str, case: Case) -> tuple[int, Any, str]:
    if case.method == "WS":
        return await _produce(http, base, case)
    headers = {"Content-Type": "application/json", **case.headers} if case.body else case.headers
    async with http.request(
        case.method,
        _url(base, case),
        data=case.body,
        headers=headers,
        allow_redirects=False,
    ) as r:
        return r.status, r.headers, await r.text(errors="replace")


async def _produce(http: aiohttp.ClientSession, base: str, case: Case) -> tuple[int, Any, str]:
    """Open the producer WebSocket ``case`` names (the first segment of a ``topic://``) and
    store one message: 200 when it is stored, else the refusal's status, headers, body."""
    path = list(case.path)
    if path[3] == "topic":
        path[3:] = ["segment", *path[4:], "0"]
    url = _url(base, Case(case.kind, "GET", path, case.params))
    try:
        ws = await http.ws_connect(url)
    except aiohttp.WSServerHandshakeError:
        async with http.get(url) as r:  # the same refusal as a plain request, with its body
            return r.status, r.headers, await r.text()
    try:
        ready = await next_frame(ws)
        assert isinstance(ready, frames.ProducerReady), ready
        await ws.send_bytes(frames.encode(frames.Send(seq=0, payload=b"lifecycle")))
        receipt = await next_frame(ws)
        if isinstance(receipt, frames.Error):
            return (
                ErrorName(receipt.error).http_status,
                {"X-Segtxn-Error": receipt.error},
                (json.dumps({"error": receipt.error, "message": receipt.message})),
            )
        assert isinstance(receipt, frames.Receipt), receipt
        return 200, {}, ""
    finally:
        await ws.close()


def judge(case: Case, status: int, headers: Any, text: str, log: ServerLog) -> None:
    """Check one answer and the log it left; tally the case."""
    TALLY.tried[case.kind] += 1
    example = f"{case}\n-> {status} {text[:300]}"
    for problem, record in log.new_problems():
        TALLY.violation(case.kind, problem, f"{example}\n{record[-1500:]}")
    if status >= 500:
        TALLY.violation(case.kind, f"{status} {headers.get('X-Segtxn-Error')}", example)
    if status < 400 or case.method == "HEAD":
        return
    try:
        body = json.loads(text)
        name, message = body["error"], body["message"]
    except (ValueError, KeyError, TypeError):
        TALLY.violation(case.kind, f"{status}: not the JSON error shape", example)
        return
    if name not in KNOWN_ERRORS or not isinstance(message, str) or not message:
        TALLY.violation(case.kind, f"{status}: unknown error {name!r}", example)
        return
    if headers.get("X-Segtxn-Error") != name:
        TALLY.violation(case.kind, f"{status} {name}: no X-Segtxn-Error header", example)
    expected = ErrorName(name).http_status
    if status != expected and (status, ErrorName(name)) not in REFUSALS:
        TALLY.violation(case.kind, f"{status} for {name} (its status is {expected})", example)
    if "Traceback" in text:
        TALLY.violation(case.kind, f"{status} {name}: a traceback in the body", example)


FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)


@pytest.mark.parametrize("group", ADMIN_GROUPS)
@settings(FUZZ, max_examples=examples(40))
@given(data=st.data())
async def test_admin_endpoints(
    cluster: Cluster, known: Known, server_log: ServerLog, group: str, data: st.DataObject
) -> None:
    case = data.draw(admin_case(group), label="case")
    async with aiohttp.ClientSession() as http:
        status, headers, text = await send(http, cluster.url, case)
    judge(case, status, headers, text, server_log)


@settings(FUZZ, max_examples=examples(15))
@given(data=st.data())
async def test_topic_lifecycles(
    cluster: Cluster, known: Known, server_log: ServerLog, data: st.DataObject
) -> None:
    async with aiohttp.ClientSession() as http:
        for case in data.draw(lifecycle(), label="calls"):
            status, headers, text = await send(http, cluster.url, case)
            judge(case, status, headers, text, server_log)


@pytest.mark.parametrize("group", COORDINATOR_GROUPS)
@settings(FUZZ, max_examples=examples(40))
@given(data=st.data())
async def test_coordinator_endpoints(
    cluster: Cluster, known: Known, server_log: ServerLog, group: str, data: st.DataObject
) -> None:
    case = data.draw(coordinator_case(group, known.txns), label="case")
    async with aiohttp.ClientSession() as http:
        status, headers, text = await send(http, cluster.coordinator.settings.advertise_url, case)
    judge(case, status, headers, text, server_log)


# ---------------------------------------------------------------------- HTTP itself

RAW_REQUESTS = [
    b"G@T /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST /txn/v2/new HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /txn/v2/new HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET /healthz?" + b"q" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"h" * 100_000 + b"\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-N: 1\r\n" * 200 + b"\r\n",
    b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
]


@st.composite
def http_case(draw: st.DrawFn) -> Case:
    """Any method on any path, with headers, queries and bodies at and past the limits."""
    words = st.sampled_from(["admin", "v2", "txn", "ws", "lookup"])
    path = draw(st.lists(PART | words, max_size=7))
    headers = draw(
        st.sampled_from(
            [{}, {"X-Big": "h" * 100_000}, {"X-Edge": "h" * 8000}, {"Content-Type": "text/x"}]
        )
    )
    params = draw(
        st.sampled_from([{}, {"q": "x" * 20_000}, {"q": "x" * 7000}]) | query(limit=NUMBER)
    )
    body = draw(st.none() | BODY | st.just(b"x" * (2 << 20)))
    method = draw(METHOD)
    if method == "HEAD" and (headers or params.get("q")):
        # refused before the method is known, the answer has a body, which a client takes
        # for a broken answer to a HEAD: not something a server can help
        method = "GET"
    return Case("http-level", method, path, params, body, headers)


async def _raw(host: str, port: int, data: bytes) -> tuple[int, dict[str, str], str]:
    """Send bytes as they are; (status, headers, body) of the answer."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers, body.decode(errors="replace")


@pytest.mark.parametrize("server", ["broker", "coordinator"])
async def test_malformed_http_gets_the_json_error(
    cluster: Cluster, known: Known, server_log: ServerLog, server: str
) -> None:
    coordinator = cluster.coordinator.settings.advertise_url
    url = yarl.URL(cluster.url if server == "broker" else coordinator)
    assert url.host is not None and url.port is not None
    for data in RAW_REQUESTS:
        case = Case("http-level", "RAW", [], body=data)
        status, headers, text = await _raw(url.host, url.port, data)
        judge(case, status, headers, text, server_log)
        assert status in (400, 431), (data[:60], status, text)


@settings(FUZZ, max_examples=examples(40))
@given(data=st.data())
async def test_any_method_on_any_path(
    cluster: Cluster, known: Known, server_log: ServerLog, data: st.DataObject
) -> None:
    case = data.draw(http_case(), label="case")
    base = data.draw(
        st.sampled_from([cluster.url, cluster.coordinator.settings.advertise_url]), label="server"
    )
    async with aiohttp.ClientSession() as http:
        status, headers, text = await send(http, base, case)
    judge(case, status, headers, text, server_log)
