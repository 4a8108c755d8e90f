"""``GET /admin/v2/brokers/{broker}/homes``: which topics and segments a broker holds;
``POST``/``DELETE /admin/v2/brokers/{broker}/drain``: hand them all to the others.

Without replication a topic or segment lives on its home broker's disk and never moves
(:mod:`segtxn.topics.catalog`), so removing the broker strands it; with it, a drain
(:mod:`segtxn.broker.handoff`) moves them first. The operator asks this before it lowers
a cluster's broker count (its scale-down guard); any broker answers for any other, alive
or not, from the store's ``homes-by-broker`` index (one bounded range read).
"""

from __future__ import annotations

from aiohttp import web

from segtxn.broker import handoff
from segtxn.broker.http import SERVICE, json_errors
from segtxn.broker.settings import BROKER_ID
from segtxn.inputs import takes
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import parse_int

MAX_LISTED = 1000
"""The most homes one answer names (``more`` says whether there are others)."""


@takes("limit")
@json_errors
async def homes(request: web.Request) -> web.StreamResponse:
    """``{"broker": ID, "homes": [ledger names], "more": bool, "registered": bool}``;
    ``?limit=N`` (1..1000, default 100) bounds the list. ``registered``: a broker of that id
    is registered now (a stopped broker still holds its homes; a typo holds none).
    InvalidArgument for an id no broker can have."""
    broker = request.match_info["broker"]
    if not BROKER_ID.fullmatch(broker):
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"{broker[:80]!r} is not a broker id")
    limit = parse_int(request.query.get("limit", "100"), "limit", lo=1, hi=MAX_LISTED)
    catalog = request.app[SERVICE].catalog
    ledgers, more = await catalog.homes_on(broker, limit=limit)
    registered = await catalog.broker_url(broker) is not None
    return web.json_response(
        {"broker": broker, "homes": ledgers, "more": more, "registered": registered}
    )


@json_errors
async def drain(request: web.Request) -> web.StreamResponse:
    """``POST``: hand every topic the broker holds to the others
    (:mod:`segtxn.broker.handoff`); ``{"broker", "moved": [...], "failed": {...}}``.
    ``DELETE``: stop draining (new topics may be placed on it again). Answered by that
    broker: another one redirects (NotOwner) or, if it is not registered, ServiceNotReady."""
    service = request.app[SERVICE]
    broker = request.match_info["broker"]
    if not BROKER_ID.fullmatch(broker):
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"{broker[:80]!r} is not a broker id")
    if broker != service.broker_id:
        url = await service.catalog.broker_url(broker)
        if url is None:
            raise ServerError(ErrorName.SERVICE_NOT_READY, f"broker {broker} is not registered")
        raise ServerError(ErrorName.NOT_OWNER, f"broker {broker} is at {url}", redirect=url)
    if request.method == "DELETE":
        await service.set_draining(False)
        return web.json_response({"broker": broker, "draining": False})
    return web.json_response(await handoff.drain(service))


def routes() -> list[web.RouteDef]:
    """Registered before the topic routes: ``brokers/{id}/homes`` has the shape of a
    namespace listing (``{domain}/{tenant}/{namespace}``)."""
    return [
        web.get("/admin/v2/brokers/{broker}/homes", homes),
        web.post("/admin/v2/brokers/{broker}/drain", drain),
        web.delete("/admin/v2/brokers/{broker}/drain", drain),
    ]
