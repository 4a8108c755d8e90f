"""``POST .../subscription/{sub}/repair[?to=earliest|L:E]``: rewrite a subscription's cursor
record that does not read (docs/ledger.md, "Repairing a damaged cursor").

A cursor record that does not decode makes the topic's every load fail (``PersistenceError``
naming the record), so the subscription cannot be reset through the loaded topic. This
endpoint, answered by the topic's home broker like every admin call on it (others answer
307 to it), repairs the record without loading the topic
(:func:`segtxn.ledger.cursor_repair.repair_cursor`: the contract, the compare-and-set, what
it refuses); the next lookup then loads the topic, and the subscription is delivered every
retained entry again (or from ``to``), never fewer. It never creates a topic (an unknown one
is ``TopicNotFound``, even where topics are made on first use).

Once repaired, the topic is no longer among the broker's refused ones (``/readyz`` stops
naming it; a load that meets other damage names it again).

A topic loaded here whose record was damaged after it loaded is unloaded first (its clients
are hung up on and come back through lookup): its cursor's next save would be refused by
the repaired record's version anyway, and only a load reads the repair. A ``topic://`` is
refused: the damage is one segment's, and the error names it (``segment://...``).
"""

from __future__ import annotations

from aiohttp import web

from segtxn.broker import deletemark, fencing, retire
from segtxn.broker.http import SERVICE, check_name, json_errors, topic_from
from segtxn.inputs import takes
from segtxn.ledger.cursor_repair import (
    CursorChanged,
    CursorNotFound,
    CursorReadable,
    LedgerNotFound,
    TargetBeyondEnd,
    cursor_damage,
    repair_cursor,
)
from segtxn.ledger.errors import CursorDamaged, LedgerCorrupted
from segtxn.ledger.position import Position
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import parse_position
from segtxn.protocol.names import Domain

_REFUSALS: dict[type[Exception], ErrorName] = {
    LedgerNotFound: ErrorName.SUBSCRIPTION_NOT_FOUND,
    CursorNotFound: ErrorName.SUBSCRIPTION_NOT_FOUND,
    CursorReadable: ErrorName.NOT_ALLOWED,
    TargetBeyondEnd: ErrorName.INVALID_ARGUMENT,
    CursorChanged: ErrorName.PRECONDITION_FAILED,
    LedgerCorrupted: ErrorName.PERSISTENCE,
}
"""How each refusal of the repair is answered: 404, 405, 400, 412, 500."""


def _start(request: web.Request) -> Position | None:
    """``to``: ``earliest`` (the default: None) or the next entry to deliver."""
    to = request.query.get("to", "earliest")
    return None if to == "earliest" else Position(*parse_position(to, "to"))


@takes("to")
@json_errors
async def repair(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    name = topic_from(request)
    subscription = check_name("subscription", request.match_info["subscription"])
    start = _start(request)
    if name.domain is Domain.TOPIC:
        raise ServerError(
            ErrorName.NOT_ALLOWED,
            f"{name} is a scalable topic: repair the segment the error names (segment://...)",
        )
    fencing.check(service)
    if await service.catalog.home_of(name) is None:  # (check_home would create it)
        raise ServerError(ErrorName.TOPIC_NOT_FOUND, f"topic {name} does not exist")
    await service.check_home(name)
    await deletemark.check_not_marked(service.catalog, name)
    if name.domain is Domain.SEGMENT:
        await retire.check_not_retired(service.catalog, name)
    ledger = str(name)
    if name in service.topics and await cursor_damage(service.store, ledger, subscription):
        await service.unload(name)
    try:
        repaired = await repair_cursor(service.store, ledger, subscription, start=start)
    except tuple(_REFUSALS) as e:
        error = next(n for kind, n in _REFUSALS.items() if isinstance(e, kind))
        raise ServerError(error, str(e)) from e
    if isinstance(service.refused.get(name), CursorDamaged):
        # not known damaged any more: /readyz stops naming it (the next load tells)
        del service.refused[name]
        service.load_refusals.forget(name)
    return web.json_response(
        {
            "topic": str(name),
            "subscription": subscription,
            "key": repaired.key,
            "start": str(repaired.next_position),
            "replaced": {"reason": repaired.reason, "bytes": len(repaired.replaced)},
        }
    )
