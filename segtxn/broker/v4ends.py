"""PIP-31's second phase at a participant: the v4 coordinator's ``END_TXN_ON_PARTITION``
(``POST /admin/v2/persistent/.../txn/{txn}/end?action=COMMIT|ABORT``: write the marker) and
``END_TXN_ON_SUBSCRIPTION`` (``.../subscription/{sub}/txn/{txn}/end``: apply or release the
pending acks), routed from the admin API's route table (:func:`.admin.routes`).

Contract, both endpoints: idempotent (the coordinator's fan-out,
:mod:`segtxn.coordinator.fanout`, retries and may run twice, and aiohttp does not cancel a
handler whose client went away); 204 once the decision holds here, also where nothing is left
to apply (a topic marked ``deleting``, a subscription deleted since); ``InvalidArgument`` for
a bad id or action; ``NotAllowed`` for a v5 transaction or a topic without v4 markers. An
END whose ledger failed it (a partition's marker not written, a subscription's cursor not
saved) answers ``ServiceNotReady`` when the failure may pass (the topic is moving, too few
replicas, a full disk: the coordinator's fan-out retries) or ``PersistenceError``, naming
the cause (a damaged, missing or foreign ledger file; a damaged cursor record and its
repair), which fails the client's END_TXN at once and which the coordinator's background
finishing tries again until an operator's repair: :func:`_may_pass` decides, and
:func:`_not_applied` for a subscription. Never an internal error: the cause is in the
answer, not only in this broker's log.

Apart from :mod:`.admin` because these are the transaction protocol's calls, not the
management of topics: they answer to the coordinator's retry rules and the v4 buffers
(:mod:`.txn.markers`, :mod:`.txn.pending_ack_log`), which nothing else in the admin API uses.
"""

from __future__ import annotations

from aiohttp import web

from segtxn.broker import deletemark
from segtxn.broker.http import SERVICE, json_errors, topic_from
from segtxn.broker.service import BrokerService
from segtxn.broker.txn.markers import MarkerTransactionBuffer
from segtxn.broker.txn.pending_ack_log import MLPendingAckStore
from segtxn.inputs import takes
from segtxn.ledger import LedgerClosed, LedgerError, LedgerFenced
from segtxn.ledger.cursor import cursor_key
from segtxn.ledger.cursor_repair import cursor_damage
from segtxn.ledger.errors import CursorDamaged
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.names import TopicName
from segtxn.protocol.txn import TxnAction, TxnId


def _v4_end(request: web.Request) -> tuple[TxnId, TxnAction]:
    try:
        txn = TxnId.parse(request.match_info["txn"])
        action = TxnAction(request.query.get("action", ""))
    except ValueError as e:
        raise ServerError(ErrorName.INVALID_ARGUMENT, f"{e} (action: COMMIT or ABORT)") from e
    if txn.is_v5:
        raise ServerError(ErrorName.NOT_ALLOWED, f"{txn} is a v5 transaction: no markers")
    return txn, action


@takes("action")
@json_errors
async def end_txn_on_partition(request: web.Request) -> web.StreamResponse:
    """PIP-31's END_TXN_ON_PARTITION (from the v4 coordinator): the marker, if the
    transaction wrote here. Idempotent."""
    txn, action = _v4_end(request)
    if await _being_deleted(request):
        return web.Response(status=204)
    topic = await request.app[SERVICE].serve(topic_from(request))
    if not isinstance(topic.buffer, MarkerTransactionBuffer):
        raise ServerError(ErrorName.NOT_ALLOWED, f"{topic.name}: not a v4 (persistent://) topic")
    try:
        await topic.buffer.end(txn, action)
    except LedgerError as e:  # (here, not in end(): the v4 checks' sweep retries a LedgerError)
        raise ServerError(
            ErrorName.SERVICE_NOT_READY if _may_pass(e) else ErrorName.PERSISTENCE,
            f"{topic.name}: the {action.value} marker of {txn} could not be written: {e}",
        ) from e
    return web.Response(status=204)


@takes("action")
@json_errors
async def end_txn_on_subscription(request: web.Request) -> web.StreamResponse:
    """PIP-31's END_TXN_ON_SUBSCRIPTION: apply (commit) or release (abort) the pending
    acks of the transaction on this subscription. Idempotent."""
    txn, action = _v4_end(request)
    if await _being_deleted(request):
        return web.Response(status=204)
    topic = await request.app[SERVICE].serve(topic_from(request))
    name = request.match_info["subscription"]
    subscription = await topic.existing_subscription(name)
    if subscription is None:
        return web.Response(status=204)  # deleted since: nothing pending any more
    pending = subscription.pending_acks
    if not isinstance(pending, MLPendingAckStore):
        raise ServerError(ErrorName.NOT_ALLOWED, f"{topic.name}: not a v4 (persistent://) topic")
    try:
        await pending.end(txn, action)
    except LedgerError as e:  # (here, not in end(): the sweep retries a LedgerError)
        raise await _not_applied(request.app[SERVICE], topic.name, name, action, e) from e
    return web.Response(status=204)


async def _not_applied(
    service: BrokerService,
    name: TopicName,
    subscription: str,
    action: TxnAction,
    error: LedgerError,
) -> ServerError:
    """Why a v4 decision could not be applied to ``subscription`` (its cursor's save or its
    pending-ack log's write failed; the same END again applies what is left of it):
    ``ServiceNotReady`` if ``error`` may pass (the coordinator retries), else
    ``Persistence``, at once. A cursor record damaged under the loaded topic (its save
    refused by the record's version: "changed by another owner") is named as a load names
    it, with its repair. One that reads was saved by another owner or rewritten by an
    operator (``CursorOverwritten``: the broker lets the topic go, to load it again from
    the record), or the cursor was closed under the END (an unload, a drain): the topic is
    moving, ``ServiceNotReady``, and the coordinator's retry finds its new home. It was an
    internal error, its cause only in this broker's log."""
    damage = await cursor_damage(service.store, str(name), subscription)
    why = (
        error
        if damage is None
        else CursorDamaged(str(name), subscription, cursor_key(str(name), subscription), damage)
    )
    return ServerError(
        ErrorName.SERVICE_NOT_READY
        if damage is None and _may_pass(error)
        else ErrorName.PERSISTENCE,
        f"{name} subscription {subscription!r}: the {action.value} could not be applied: {why}",
    )


def _may_pass(error: LedgerError) -> bool:
    """Whether the ledger ``error`` that failed a v4 end may pass without an operator: it
    is retriable (too few replicas, a full disk, a write failed for either, or fenced by
    another owner), or the ledger (or cursor) was fenced or closed under the END (an
    unload, a drain, another broker's take-over): the topic is moving, and the
    coordinator's retry finds its new home. Anything else (a ledger file damaged, missing
    or another's, a write the disk refused) lasts until an operator acts."""
    return error.retriable or isinstance(error, LedgerFenced | LedgerClosed)


async def _being_deleted(request: web.Request) -> bool:
    """Whether the request's topic is marked ``deleting`` and not loaded here (a deletion
    of it stopped part-way: :mod:`.deletemark`): a v4 decision's end on it has nothing
    left to write or apply, since everything the transaction wrote or acknowledged there
    goes with it, as with a deleted topic (which the coordinator takes as done). Loading
    it for the end was refused, ServiceNotReady, which the coordinator retried until its
    fan-out gave up, and the client's commit or abort waited out its whole timeout."""
    service, name = request.app[SERVICE], topic_from(request)
    return name not in service.topics and await deletemark.marked(service.catalog, name) is not None
