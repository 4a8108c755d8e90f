"""The coordinator's HTTP API: PIP-31's client commands as JSON over HTTP.

| wire command | HTTP |
| --- | --- |
| NEW_TXN | ``POST /txn/v2/new?timeout_s=[&protocol=v4]`` -> ``{"txnId": "MOST:LEAST", ...}`` |
| NEW_TXN x N (v5) | ``POST /txn/v2/new?timeout_s=&count=N`` -> ``{"transactions": [...]}`` |
| ADD_PARTITION_TO_TXN | ``POST /txn/v2/{txn}/partitions`` body ``{"topics": [...]}`` |
| ADD_SUBSCRIPTION_TO_TXN | ``POST /txn/v2/{txn}/subscriptions`` body ``{..., "subscription": S}`` |
| END_TXN | ``POST /txn/v2/{txn}/end?action=COMMIT|ABORT`` |
| (status) | ``GET /txn/v2/{txn}`` |
| (counts) | ``GET /txn/v2/stats`` -> open transactions, GC backlog, ids held |

The version is read off the transaction id: v5 ids go to :class:`CoordinatorV5` (any
process may serve them), v4 ids to :class:`CoordinatorV4`, forwarded to the process holding
the id when it is not this one. ``protocol=v4`` asks NEW_TXN for a v4 transaction.

Errors are ``{"error": NAME, "message": ...}`` (TransactionNotFound, InvalidTxnStatus,
NotAllowed, InvalidArgument, ServiceNotReady). Every call is idempotent or safe to repeat:
aiohttp does not cancel a handler whose client went away.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import hdrs, web

from segtxn import exposition, tracing
from segtxn.auth import Action, authorize, check_owner, install_auth, principal_of
from segtxn.boundary import error_response, install, server_span
from segtxn.coordinator.metrics import CoordinatorMetrics
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.coordinator.txnlog import TxnMeta
from segtxn.coordinator.v4 import CoordinatorV4
from segtxn.coordinator.v5 import CoordinatorV5
from segtxn.inputs import install_declared_check, read_json, takes
from segtxn.metastore import (
    MetadataStore,
    StoreSettings,
    access_denied,
    open_store,
    wait_reachable,
)
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import (
    MAX_LIST_LIMIT,
    MAX_NEW_TXNS,
    MAX_REQUEST_BYTES,
    MAX_TOPICS_PER_CALL,
    parse_float,
    parse_int,
)
from segtxn.protocol.names import InvalidTopicName, TopicName, client_name_problem
from segtxn.protocol.txn import TxnAction, TxnId
from segtxn.stopping import Stopping
from segtxn.topics.transactions import TxnHeader
from segtxn.web import AppServer, Listener, relay

log = logging.getLogger(__name__)

COORDINATOR = web.AppKey("coordinator", CoordinatorV5)
V4 = web.AppKey("coordinator-v4", CoordinatorV4)
V4_OFF = (
    "this coordinator does not serve v4 (persistent://) transactions: start it with "
    "--data-dir (or --replication), as every coordinator of the cluster"
)
METRICS = web.AppKey("metrics", CoordinatorMetrics)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _errors(handler: Handler) -> Handler:
    """A handler whose ServerErrors become the JSON error body (everything else, a metadata
    store that does not answer among them, is :mod:`segtxn.boundary`'s)."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ServerError as e:
            return error_response(e, request)

    return wrapped


def _txn(request: web.Request) -> TxnId:
    try:
        return TxnId.parse(request.match_info["txn"])
    except ValueError as e:
        raise ServerError(ErrorName.INVALID_ARGUMENT, str(e)) from e


def _header(txn: TxnId, header: TxnHeader) -> dict[str, object]:
    return {
        "txnId": str(txn),
        "state": header.state.value,
        "timeoutMs": header.timeout_ms,
        "createdMs": header.created_ms,
        "finalizedMs": header.finalized_ms,
        "owner": header.owner,
    }


def _v4_meta(meta: TxnMeta) -> dict[str, object]:
    return {
        "txnId": str(TxnId(*meta.txn)),
        "state": meta.state,
        "timeoutMs": meta.timeout_ms,
        "createdMs": meta.created_ms,
        "finalizedMs": meta.finalized_ms,
        "partitions": meta.partitions,
        "subscriptions": [list(s) for s in meta.subscriptions],
        "owner": meta.owner,
    }


async def _check_owner(request: web.Request, txn: TxnId) -> None:
    """Refuse a call on ``txn`` from a role that did not open it (security on; superusers
    may). Raises ServerError(NotAuthorized / TransactionNotFound)."""
    principal = principal_of(request)
    if principal is None or principal.superuser:
        return
    if txn.is_v5:
        owner = await request.app[COORDINATOR].owner(txn)
    else:
        owner = request.app[V4].status(txn).owner
    check_owner(principal, owner, f"transaction {txn}")


_PRODUCE = frozenset({Action.PRODUCE})
_CONSUME = frozenset({Action.CONSUME})


def _authorize_topics(
    request: web.Request,
    topics: list[str],
    action: frozenset[Action],
    subscription: str | None = None,
) -> None:
    """Joining a topic to a transaction needs ``produce`` on its namespace, a subscription
    ``consume`` there (on ``subscription`` when the call names one: a grant may restrict
    its ``consume`` to some subscriptions). Security off: nothing to check.
    Raises ServerError(NotAuthorized / InvalidTopicName)."""
    if principal_of(request) is None:
        return
    for topic in topics:
        try:
            name = TopicName.parse(topic)
        except InvalidTopicName as e:
            raise ServerError(ErrorName.INVALID_TOPIC_NAME, str(e)) from e
        authorize(request, action, (name.tenant, name.namespace), subscription)


async def _topics(request: web.Request) -> tuple[list[str], str | None]:
    """The body of ADD_*: its topics (and subscription, for ADD_SUBSCRIPTION)."""
    body = await read_json(request)
    topics = body.get("topics") if isinstance(body, dict) else None
    if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
        raise ServerError(ErrorName.INVALID_ARGUMENT, 'expected {"topics": [...]}')
    if len(topics) > MAX_TOPICS_PER_CALL:
        raise ServerError(
            ErrorName.INVALID_ARGUMENT,
            f"{len(topics)} topics in one call; at most {MAX_TOPICS_PER_CALL}",
        )
    subscription = body.get("subscription")
    if subscription is not None:
        problem = (
            "subscription must be a string"
            if not isinstance(subscription, str)
            else client_name_problem("subscription", subscription)
        )
        if problem is not None:
            raise ServerError(ErrorName.INVALID_ARGUMENT, problem)
    return topics, subscription


def _v4_here(handler: Handler) -> Handler:
    """Serve a call about a v4 transaction here if this process holds its coordinator id,
    else forward it to the holder."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        txn = _txn(request)
        v4 = request.app[V4]
        if txn.is_v5 or v4.holds(txn):
            return await handler(request)
        holder = await v4.holder_url(txn)
        if holder.rstrip("/") == v4.settings.advertise_url.rstrip("/"):
            raise ServerError(ErrorName.SERVICE_NOT_READY, f"{txn}: recovering its coordinator")
        if principal_of(request) is not None and hdrs.AUTHORIZATION not in request.headers:
            # Authenticated by its certificate: a relay would carry no credential of the
            # caller, and go out as this server (the cluster role, a superuser). It goes to
            # the holder itself, which checks its certificate.
            location = holder.rstrip("/") + request.path_qs
            return web.Response(status=307, headers={hdrs.LOCATION: location})
        try:
            return await relay(v4.http, request, holder)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ServerError(
                ErrorName.SERVICE_NOT_READY, f"{txn}: its coordinator at {holder}: {e!r}"
            ) from e

    return wrapped


@takes("timeout_s", "protocol", "count")
@server_span(tracing.COORDINATOR, "new-txn")
@_errors
async def new_txn(request: web.Request) -> web.StreamResponse:
    timeout = request.query.get("timeout_s")
    timeout_s = None if timeout is None else parse_float(timeout, "timeout_s")
    protocol = request.query.get("protocol", "v5")
    given = request.query.get("count")
    count = None if given is None else parse_int(given, "count", lo=1, hi=MAX_NEW_TXNS)
    principal = principal_of(request)
    owner = None if principal is None else principal.role
    if protocol == "v4":
        if count is not None:
            raise ServerError(ErrorName.INVALID_ARGUMENT, "count: v5 transactions only")
        if not request.app[V4].settings.v4_coordinator_ids:  # never: no use trying again
            raise ServerError(ErrorName.NOT_ALLOWED, V4_OFF)
        _, meta = await request.app[V4].new_txn(timeout_s, owner)
        tracing.annotate({"segtxn.txn.id": str(TxnId(*meta.txn))})
        return web.json_response(_v4_meta(meta))
    if protocol != "v5":
        raise ServerError(ErrorName.INVALID_ARGUMENT, "protocol: v4 or v5")
    if count is None:
        txn, header = await request.app[COORDINATOR].new_txn(timeout_s, owner)
        tracing.annotate({"segtxn.txn.id": str(txn)})
        return web.json_response(_header(txn, header))
    opened = await request.app[COORDINATOR].new_txns(count, timeout_s, owner)
    return web.json_response({"transactions": [_header(txn, header) for txn, header in opened]})


@_errors
@_v4_here
async def add_participants(request: web.Request) -> web.StreamResponse:
    txn = _txn(request)
    topics, subscription = await _topics(request)
    await _check_owner(request, txn)
    joining_subscription = request.path.endswith("/subscriptions")
    if joining_subscription:
        _authorize_topics(request, topics, _CONSUME, subscription)
    else:
        _authorize_topics(request, topics, _PRODUCE)
    if txn.is_v5:
        request.app[COORDINATOR].add_participants(txn, topics)
    elif joining_subscription:
        if subscription is None:
            raise ServerError(ErrorName.INVALID_ARGUMENT, "which subscription?")
        await request.app[V4].add_participants(txn, [], [(t, subscription) for t in topics])
    else:
        await request.app[V4].add_participants(txn, topics, [])
    return web.Response(status=204)


@takes("action")
@server_span(tracing.COORDINATOR, "end-txn")
@_errors
@_v4_here
async def end_txn(request: web.Request) -> web.StreamResponse:
    txn = _txn(request)
    try:
        action = TxnAction(request.query.get("action", ""))
    except ValueError:
        raise ServerError(ErrorName.INVALID_ARGUMENT, "action: COMMIT or ABORT") from None
    await _check_owner(request, txn)
    tracing.annotate({"segtxn.txn.id": str(txn), "segtxn.txn.action": action.value})
    started = time.perf_counter()
    if not txn.is_v5:
        meta = _v4_meta(await request.app[V4].end_txn(txn, action))
    else:
        header = await request.app[COORDINATOR].end_txn(txn, action, tracing.current_traceparent())
        meta = _header(txn, header)
    request.app[METRICS].end_txn.record(
        time.perf_counter() - started,
        {"action": action.value.lower(), "protocol": "v5" if txn.is_v5 else "v4"},
    )
    return web.json_response(meta)


@takes("limit")
@_errors
async def list_open(request: web.Request) -> web.StreamResponse:
    limit = parse_int(request.query.get("limit", "1000"), "limit", lo=1, hi=MAX_LIST_LIMIT)
    found = await request.app[COORDINATOR].list_open(limit)
    return web.json_response({"transactions": [_header(t, h) for t, h in found]})


OPEN_COUNT_LIMIT = 100_000
"""``/txn/v2/stats`` counts open transactions up to this many (``openTransactionsCapped``)."""


@_errors
async def stats(request: web.Request) -> web.StreamResponse:
    """What the operator puts in TransactionCoordinator status. The GC backlog is the
    last sweep's count over all coordinator ids (every coordinator sweeps them all)."""
    coordinator = request.app[COORDINATOR]
    open_count = await coordinator.count_open(OPEN_COUNT_LIMIT)
    return web.json_response(
        {
            "openTransactions": open_count,
            "openTransactionsCapped": open_count >= OPEN_COUNT_LIMIT,
            "gcBacklog": coordinator.gc_backlog,
            "idsHeld": [f"{i:x}" for i in sorted(coordinator.held)],
        }
    )


@_errors
@_v4_here
async def status(request: web.Request) -> web.StreamResponse:
    txn = _txn(request)
    await _check_owner(request, txn)
    if not txn.is_v5:
        return web.json_response(_v4_meta(request.app[V4].status(txn)))
    return web.json_response(_header(txn, await request.app[COORDINATOR].status(txn)))


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """200 while it holds a coordinator id and the metadata store takes its credentials;
    503 otherwise (``reason`` says the store's refusal)."""
    coordinator = request.app[COORDINATOR]
    denied = await access_denied(coordinator.store)
    ready = bool(coordinator.held) and denied is None
    body: dict[str, Any] = {"ready": ready, "ids": [f"{i:x}" for i in sorted(coordinator.held)]}
    if denied is not None:
        body["reason"] = f"the metadata store refuses the coordinator's credentials: {denied}"
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    return exposition.response(request.app[METRICS])


def create_app(
    settings: CoordinatorSettings, store: MetadataStore | None = None
) -> web.Application:
    """The coordinator app; it opens ``settings.store_url`` unless handed a store (then
    the caller owns it: ``segtxn standalone`` shares its broker's embedded store)."""
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    brokers = "this is a transaction coordinator; topics are served by the brokers"
    install(app, {"/admin/": brokers, "/lookup/": brokers, "/ws/": brokers})  # error boundary
    install_auth(app, settings.auth)  # inside it: its refusals get the JSON shape
    install_declared_check(app)  # after auth: a 401/403 stays one, and tells no parameters
    own = store is None
    used = (
        open_store(settings.store_url, StoreSettings(credentials=settings.store_credentials))
        if store is None
        else store
    )
    app[COORDINATOR] = CoordinatorV5(used, settings)
    app[V4] = CoordinatorV4(used, settings)
    app[METRICS] = CoordinatorMetrics(app[COORDINATOR], app[V4])

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        # A failure or cancellation half-way closes what was opened and raises on.
        try:
            await wait_reachable(used, timeout_s=settings.store_timeout_s, url=settings.store_url)
            await app[COORDINATOR].start()
            await app[V4].start()
        except BaseException:
            await stop()
            raise
        yield
        await stop()

    async def stop() -> None:
        """Every step, whatever an earlier one raised (the store may be down), within one
        time limit (:mod:`segtxn.stopping`)."""
        log.info("coordinator %s: stopping; resigning its ids", settings.advertise_url)
        stopping = Stopping(f"coordinator {settings.advertise_url}")
        await app[V4].stop(stopping)
        await app[COORDINATOR].stop(stopping)
        if own:
            await stopping.step("closing the metadata store", used.close())
        log.info("coordinator %s: stopped", settings.advertise_url)

    app.cleanup_ctx.append(lifecycle)
    app.add_routes(
        [
            web.post("/txn/v2/new", new_txn),
            web.get("/txn/v2/open", list_open),
            web.get("/txn/v2/stats", stats),
            web.post("/txn/v2/{txn}/partitions", add_participants),
            web.post("/txn/v2/{txn}/subscriptions", add_participants),
            web.post("/txn/v2/{txn}/end", end_txn),
            web.get("/txn/v2/{txn}", status),
            web.get("/healthz", healthz),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics),
        ]
    )
    return app


class CoordinatorServer(AppServer):
    """Runs one coordinator app on a host and port, or on ``listener`` (``start`` /
    ``stop``). A port the system picks is a :class:`~segtxn.web.Listener`'s on port 0:
    ``settings.advertise_url`` names its port."""

    def __init__(
        self,
        settings: CoordinatorSettings,
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
            metrics=app[METRICS],
        )
        self.settings = settings

    @property
    def coordinator(self) -> CoordinatorV5:
        return self.app[COORDINATOR]
