"""Every route of both servers is classified; one that is not is refused to all but
superusers (a new endpoint cannot be added without deciding who may call it)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from segtxn.auth import install_auth
from segtxn.auth.endpoints import Kind, classified, rule_for
from segtxn.boundary import install
from segtxn.broker.app import BrokerServer
from segtxn.broker.app import create_app as broker_app
from segtxn.broker.settings import BrokerSettings
from segtxn.coordinator.app import create_app as coordinator_app
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.ledger.replicas import Replication
from segtxn.web import Listener
from tests.auth.conftest import OPS, PRODUCER, ROOT, auth_settings, bearer, token


def _routes(app: web.Application) -> list[tuple[str, str]]:
    return [(r.method, r.resource.canonical) for r in app.router.routes() if r.resource]


def test_every_route_of_both_servers_is_classified(tmp_path: Path) -> None:
    broker = broker_app(
        BrokerSettings(
            broker_id="b1",
            advertise_url="http://127.0.0.1:1",
            ledger_url=f"file://{tmp_path}",
            replication=Replication(write_quorum=1, ack_quorum=1),  # the replica routes too
        )
    )
    coordinator = coordinator_app(CoordinatorSettings(advertise_url="http://127.0.0.1:2"))
    routes = _routes(broker) + _routes(coordinator)
    assert len(routes) > 60 and any(path.startswith("/replica/") for _, path in routes)
    unclassified = sorted({route for route in routes if not classified(*route)})
    assert unclassified == [], f"routes without an auth rule: {unclassified}"


def test_probes_are_open_and_metrics_by_setting() -> None:
    assert rule_for("GET", "/healthz").kind is Kind.OPEN
    assert rule_for("HEAD", "/readyz").kind is Kind.OPEN
    assert rule_for("GET", "/metrics").kind is Kind.OPEN
    assert rule_for("GET", "/metrics", protect_metrics=True).kind is Kind.CLUSTER
    segment = "/ws/v2/producer/{domain}/{tenant}/{namespace}/{topic}/{segment}"
    assert rule_for("GET", segment) == rule_for("GET", segment.removesuffix("/{segment}"))


@pytest.fixture
async def app_with_a_new_route(tmp_path: Path) -> AsyncIterator[str]:
    """An app with security on and a route the table does not know."""

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"called": True})

    app = web.Application()
    install(app)
    install_auth(app, auth_settings(tmp_path))
    app.router.add_post("/brand/new/{thing}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    port = listener.port
    await web.SockSite(runner, listener.socket).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_an_unclassified_route_is_for_superusers_only(app_with_a_new_route: str) -> None:
    url = app_with_a_new_route + "/brand/new/x"
    async with aiohttp.ClientSession() as http:
        async with http.post(url) as answer:
            assert answer.status == 401
            assert answer.headers["X-Segtxn-Error"] == "Unauthenticated"
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        async with http.post(url, headers=bearer(token(PRODUCER))) as answer:
            assert answer.status == 403
            assert (await answer.json())["error"] == "NotAuthorized"
        async with http.post(url, headers=bearer(token(ROOT))) as answer:
            assert answer.status == 200
            assert await answer.json() == {"called": True}
        async with http.get(app_with_a_new_route + "/no/such/path") as answer:
            assert answer.status == 404  # no route: the boundary's answer, not an auth one


async def test_metrics_protected_by_the_setting(tmp_path: Path) -> None:
    on = auth_settings(tmp_path)
    protected = dataclasses.replace(on, protect_metrics=True)
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    port = listener.port
    server = BrokerServer(
        BrokerSettings(
            broker_id="b1",
            advertise_url=f"http://127.0.0.1:{port}",
            ledger_url=f"file://{tmp_path / 'ledgers'}",
            auth=protected,
        ),
        listener=listener,
    )
    await server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/metrics") as answer:
                assert answer.status == 401
            async with http.get(url + "/metrics", headers=bearer(token(PRODUCER))) as answer:
                assert answer.status == 403
            async with http.get(url + "/metrics", headers=bearer(token(OPS))) as answer:
                assert answer.status == 200 and "segtxn" in await answer.text()
            async with http.get(url + "/healthz") as answer:
                assert answer.status == 200  # the probes stay open
    finally:
        await server.stop()
