"""``GET /admin/v2/brokers/{broker}/homes``: which topics and segments a broker holds.

A topic or segment lives on its home broker's disk and never moves (ledgers are not
replicated; :mod:`segtxn.topics.catalog`). Removing a broker therefore strands the data
of everything homed on it. The operator asks this before it lowers a cluster's broker
count (its scale-down guard); any broker answers for any other, alive or not, from the
store's ``homes-by-broker`` index (one bounded range read).
"""

from __future__ import annotations

from aiohttp import web

from segtxn.broker.http import SERVICE, json_errors
from segtxn.broker.settings import BROKER_ID
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import parse_int

MAX_LISTED = 1000
"""The most homes one answer names (``more`` says whether there are others)."""


@json_errors
async def homes(request: web.Request) -> web.StreamResponse:
    """``{"broker": ID, "homes": [ledger names], "more": bool}``; ``?limit=N`` (1..1000,
    default 100) bounds the list. InvalidArgument for an id no broker can have."""
    broker = request.match_info["broker"]
    if not BROKER_ID.fullmatch(broker):
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"{broker[:80]!r} is not a broker id")
    limit = parse_int(request.query.get("limit", "100"), "limit", lo=1, hi=MAX_LISTED)
    ledgers, more = await request.app[SERVICE].catalog.homes_on(broker, limit=limit)
    return web.json_response({"broker": broker, "homes": ledgers, "more": more})


def routes() -> list[web.RouteDef]:
    """Registered before the topic routes: ``brokers/{id}/homes`` has the shape of a
    namespace listing (``{domain}/{tenant}/{namespace}``)."""
    return [web.get("/admin/v2/brokers/{broker}/homes", homes)]
