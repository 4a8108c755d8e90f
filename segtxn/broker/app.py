"""The broker's aiohttp application and a small runner for it.

State lives under ``web.AppKey``s; the service and the HTTP client are resources opened and
closed through ``cleanup_ctx``. Health: ``/healthz`` (the process answers), ``/readyz``
(registered in the store, and its data directory holds the ledgers the store says it does).
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from segtxn import exposition
from segtxn.auth import install_auth
from segtxn.boundary import install
from segtxn.broker import (
    admin,
    datacheck,
    fanout,
    holdings,
    lookup,
    producer_endpoint,
    sockets,
    txncommit,
    ws,
)
from segtxn.broker.http import SERVICE, SOCKETS
from segtxn.broker.service import BrokerService
from segtxn.broker.settings import BrokerSettings
from segtxn.inputs import install_declared_check
from segtxn.ledger.replicas import replica_routes
from segtxn.metastore import MetadataStore, access_denied
from segtxn.protocol.limits import MAX_REQUEST_BYTES
from segtxn.web import AppServer, Listener

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(settings: BrokerSettings, store: MetadataStore | None = None) -> web.Application:
    # the largest body is a property set; WebSocket frames have their own limit (ws.py)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    coordinators = "this is a broker; transactions are served by the transaction coordinators"
    install(app, {"/txn/": coordinators})  # the error boundary
    install_auth(app, settings.auth)  # inside it: its refusals get the JSON shape
    install_declared_check(app)  # after auth: a 401/403 stays one, and tells no parameters
    app[SERVICE] = BrokerService(settings, store)
    app[SOCKETS] = weakref.WeakSet()
    app.on_shutdown.append(sockets.close_sockets)

    async def service_ctx(app: web.Application) -> AsyncIterator[None]:
        await app[SERVICE].start()
        yield
        await app[SERVICE].stop()

    async def http_ctx(app: web.Application) -> AsyncIterator[None]:
        # as the cluster role, over TLS when it is on
        async with settings.auth.cluster_session(
            timeout=aiohttp.ClientTimeout(total=30)
        ) as session:
            app[fanout.HTTP] = session
            app[SERVICE].controllers.start(session)
            yield

    app.cleanup_ctx.extend([service_ctx, http_ctx])
    topic = "/{domain}/{tenant}/{namespace}/{topic}"  # any domain: the parser names errors
    segment = "/{domain:segment}/{tenant}/{namespace}/{topic}/{segment:[0-9]+}"
    app.add_routes(
        [
            *(
                web.get("/ws/v2/producer" + shape, producer_endpoint.producer)
                for shape in (topic, segment)
            ),
            *(
                web.get("/ws/v2/consumer" + shape + "/{subscription}", ws.consumer)
                for shape in (topic, segment)
            ),
            *(web.get("/ws/v2/reader" + shape, ws.reader) for shape in (topic, segment)),
            web.get("/healthz", healthz),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics),
            *holdings.routes(),
            *admin.routes(),
            *lookup.routes(),
            *txncommit.routes(),
        ]
    )
    nodes = app[SERVICE].replica_nodes
    if nodes is not None:
        app.add_routes(replica_routes(nodes.node))
    return app


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """200 once registered and holding its data; 503 with ``reason`` otherwise (e.g. an
    empty or wrong data directory: ``refused`` names the topics and why; the metadata
    store refusing the broker's credentials)."""
    service = request.app[SERVICE]
    ready, body = datacheck.readiness(service, await access_denied(service.store))
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    return exposition.response(request.app[SERVICE].metrics)


class BrokerServer(AppServer):
    """Runs one broker app on a host and port, or on ``listener`` (``start`` / ``stop``),
    for the CLI, ``standalone`` and tests. A port the system picks is a
    :class:`~segtxn.web.Listener`'s on port 0: ``settings.advertise_url`` names its port."""

    def __init__(
        self,
        settings: BrokerSettings,
        host: str | None = None,
        port: int | None = None,
        store: MetadataStore | None = None,
        *,
        access_log: bool = False,
        listener: Listener | None = None,
    ) -> None:
        app = create_app(settings, store)
        super().__init__(
            app,
            settings.advertise_url,
            host,
            port,
            settings.auth.tls,
            access_log=access_log,
            listener=listener,
            connections=settings.connections,
            metrics=app[SERVICE].metrics,
        )
        self.settings = settings

    @property
    def service(self) -> BrokerService:
        return self.app[SERVICE]
