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

from segtxn.boundary import error_response
from segtxn.broker import handoff
from segtxn.broker.http import SERVICE, json_errors
from segtxn.broker.settings import BROKER_ID
from segtxn.inputs import takes
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import parse_int
from segtxn.topics.catalog import BROKERS

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
    broker: another one redirects (NotOwner); a broker that is not registered gets a 404
    InvalidArgument naming the registered ones, an undrain saying there is nothing to
    undrain (:func:`not_registered`)."""
    service = request.app[SERVICE]
    broker = request.match_info["broker"]
    if not BROKER_ID.fullmatch(broker):
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"{broker[:80]!r} is not a broker id")
    if broker != service.broker_id:
        url = await service.catalog.broker_url(broker)
        if url is None:
            return await not_registered(request, broker)
        raise ServerError(ErrorName.NOT_OWNER, f"broker {broker} is at {url}", redirect=url)
    if request.method == "DELETE":
        await service.set_draining(False)
        return web.json_response({"broker": broker, "draining": False})
    return web.json_response(await handoff.drain(service))


MAX_NAMED_BROKERS = 20
"""The most registered ids a "not registered" answer names."""


NOTHING_TO_UNDRAIN = (
    "not registered now, so there is no drain of it to stop here (a broker that is gone "
    "starts undrained; one still running that lost its registration registers again still "
    "draining: undrain it once it is back)"
)
"""What an undrain of a broker that is not registered adds to its answer."""


async def not_registered(request: web.Request, broker: str) -> web.Response:
    """404 ``InvalidArgument`` (HTTP's "no such thing", named as an unknown path's is) for
    draining or undraining ``broker``, which is not registered: a typo, or a broker that is
    gone. The caller's mistake, answered at once; a 503 would have the client, and the
    operator through it, retry it for the whole drain timeout as if the broker were
    coming. The message names the registered brokers (at most :data:`MAX_NAMED_BROKERS`),
    so the typo shows.

    An undrain's also says that there is no drain to stop here (:data:`NOTHING_TO_UNDRAIN`):
    the drain mark is in the broker's registration (placement skips a broker that has none
    anyway) and a broker starts undrained, so a gone broker comes back taking new topics.
    A process that kept running and only lost its registration, its store unreachable for
    a session TTL, registers again still draining, unless it is undrained at its own URL
    meanwhile (:meth:`~segtxn.broker.service.BrokerService.set_draining`): the message says
    both, since this broker cannot tell them apart."""
    listing = await request.app[SERVICE].store.list_prefix(BROKERS, limit=MAX_NAMED_BROKERS)
    ids = [record.key[len(BROKERS) :] for record in listing.records]
    named = ", ".join(ids) + (", ..." if listing.more else "") if ids else "none"
    message = f"no broker {broker} is registered (registered: {named})"
    if request.method == "DELETE":
        message += f": {NOTHING_TO_UNDRAIN}"
    error = ServerError(ErrorName.INVALID_ARGUMENT, message)
    return error_response(error, request, status=404)


def routes() -> list[web.RouteDef]:
    """Registered before the topic routes: ``brokers/{id}/homes`` has the shape of a
    namespace listing (``{domain}/{tenant}/{namespace}``)."""
    return [
        web.get("/admin/v2/brokers/{broker}/homes", homes),
        web.post("/admin/v2/brokers/{broker}/drain", drain),
        web.delete("/admin/v2/brokers/{broker}/drain", drain),
    ]
