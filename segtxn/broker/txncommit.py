"""``POST /txn/v2/{txn}/commit`` on a broker, and the ``commit`` frame on a producer
connection: the one-step commit (docs/protocol.md).

A client whose v5 transaction's operations all went to this broker asks it to commit,
naming how many distinct operations it made and their digest
(:mod:`segtxn.protocol.txnops`): ``{"ops": n, "digest": d}``. The broker commits in the
op-record step that writes the last records of those operations
(:meth:`~segtxn.broker.txn.oprecords.OpRecordWriter.commit`) and answers
``{"state": "COMMITTED"}``; or it answers ``{"state": "OPEN", "reason": ...}``: nothing was
decided here, and the client ends the transaction at its coordinator as it would have
without asking. Refusals are END_TXN's: the transaction is not there
(``TransactionNotFound``), is aborted (``InvalidTxnStatus``), or is another role's
(``NotAuthorized``). A COMMITTED transaction asked again is answered COMMITTED.

The frame (:class:`~segtxn.protocol.frames.Commit`) asks the same on a connection the
client already holds: a request over HTTP cost the broker and the client about a quarter
and a third of a millisecond of CPU per transaction (py-spy, bench/peer.py ``txn 10``),
more than the op-record step itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from segtxn import tracing
from segtxn.auth import Principal, check_owner, principal_of
from segtxn.boundary import server_span
from segtxn.broker.arguments import check_txn
from segtxn.broker.http import SERVICE, json_errors
from segtxn.broker.sockets import failure_frame
from segtxn.broker.txn.commits import CommitUnknown
from segtxn.inputs import read_json
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import Commit, CommitAnswer, Error
from segtxn.protocol.limits import MAX_I64
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics import transactions as T

if TYPE_CHECKING:
    from segtxn.broker.service import BrokerService

log = logging.getLogger(__name__)
MAX_OPS = MAX_I64
_DIGEST_LIMIT = 1 << 64


def routes() -> list[web.RouteDef]:
    return [web.post("/txn/v2/{txn}/commit", commit_txn)]


def _check(value: object, field: str, limit: int, lo: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value < limit:
        raise ServerError(
            ErrorName.INVALID_ARGUMENT,
            f'expected {{"ops": n, "digest": d}} with {field} an integer in [{lo}, {limit})',
        )
    return value


@server_span(tracing.BROKER, "end-txn")
@json_errors
async def commit_txn(request: web.Request) -> web.StreamResponse:
    try:
        txn = TxnId.parse(request.match_info["txn"])
    except ValueError as e:
        raise ServerError(ErrorName.INVALID_ARGUMENT, str(e)) from e
    body = await read_json(request)
    fields = body if isinstance(body, dict) else {}
    ops, digest = fields.get("ops"), fields.get("digest")
    state, why = await commit_here(
        request.app[SERVICE], principal_of(request), txn, ops, digest, via="request"
    )
    if state is TxnState.COMMITTED:
        return web.json_response({"state": state.value})
    return web.json_response({"state": state.value, "reason": why})


async def commit_here(
    service: BrokerService,
    principal: Principal | None,
    txn: TxnId,
    ops: object,
    digest: object,
    *,
    via: str,
) -> tuple[TxnState, str]:
    """Commit ``txn`` here if its ``ops`` operations with ``digest`` were all recorded here:
    (COMMITTED, "") or (OPEN, why not: nothing was decided). ``principal``: who asks (None:
    security off); ``via``: how (``frame`` or ``request``, the metric's label).

    Raises:
        ServerError: InvalidArgument (``ops``, ``digest`` or a v4 id), TransactionNotFound,
            InvalidTxnStatus (ABORTED), NotAuthorized (another role's), ServiceNotReady
            (the broker stopped with the commit's step in flight: its outcome is unknown).
    """
    ops = _check(ops, "ops", MAX_OPS, 1)
    digest = _check(digest, "digest", _DIGEST_LIMIT, 0)
    if not txn.is_v5:
        raise ServerError(
            ErrorName.NOT_ALLOWED, f"{txn} is a v4 transaction: its coordinator ends it"
        )
    tracing.annotate({"segtxn.txn.id": str(txn), "segtxn.txn.action": "COMMIT"})

    def following(_txn: TxnId, _header: T.TxnHeader | None) -> None:
        """(The commit follows its header while it runs, so the header cache keeps it
        current, and drops it after, however little else here follows the transaction.)"""

    service.headers.listen(txn, following)
    try:
        return await _commit_here(service, principal, txn, ops, digest, via=via)
    finally:
        service.headers.forget(txn, following)


async def _commit_here(
    service: BrokerService,
    principal: Principal | None,
    txn: TxnId,
    ops: int,
    digest: int,
    *,
    via: str,
) -> tuple[TxnState, str]:
    metrics = service.metrics.txn_one_step_commits
    header, version = await service.headers.get(txn)
    if header is None:
        raise ServerError(ErrorName.TRANSACTION_NOT_FOUND, f"no transaction {txn}")
    check_owner(principal, header.owner, f"transaction {txn}")
    if header.state is TxnState.COMMITTED:
        return TxnState.COMMITTED, ""
    if header.state is TxnState.ABORTED:
        raise _already_aborted(txn)
    why = None
    if service.fenced is not None:
        why = f"this broker is fenced ({service.fenced})"
    elif time.time() * 1000 > header.timeout_ms:
        why = f"{txn} is past its timeout: its coordinator decides"
    if why is None:
        try:
            answer = await service.op_records.commit(
                txn,
                ops,
                digest,
                header=header,
                version=version,
                trace=tracing.current_traceparent(),
            )
        except CommitUnknown as e:  # (not "not here": the client must not abort it)
            raise ServerError(ErrorName.SERVICE_NOT_READY, f"{e}: its outcome is unknown") from e
        if answer.committed:
            log.debug("txn %s: COMMITTED here, in the op-record step of its last operations", txn)
            metrics.add(1, {"answer": "committed", "via": via})
            return TxnState.COMMITTED, ""
        if answer.aborted:  # (the header read above was older than the abort)
            raise _already_aborted(txn)
        why = answer.reason
    metrics.add(1, {"answer": "not_here", "via": via})
    return TxnState.OPEN, why


def _already_aborted(txn: TxnId) -> ServerError:
    return ServerError(ErrorName.INVALID_TXN_STATUS, f"{txn} is already ABORTED; cannot COMMIT")


async def answer_frame(
    service: BrokerService,
    principal: Principal | None,
    frame: Commit,
    reply: Callable[[CommitAnswer | Error], None],
) -> None:
    """Decide a ``commit`` frame on a producer connection and queue its answer with
    ``reply``: what :func:`commit_here` decided, or its refusal as an ``Error`` carrying
    the request's id.

    The transaction's header is held (:meth:`~segtxn.broker.txn.headers.HeaderCache.hold`)
    until the answer is queued: its segments here materialize the COMMITTED header just
    after, not before, so the client's wait does not grow with how many there are
    (issue 16). The frame's ``traceparent`` gets an ``end-txn`` server span, as the
    request's header does."""
    held = _txn_of(frame)
    if held is not None:
        service.headers.hold(held)
    try:
        reply(await _answer(service, principal, frame))
    finally:
        if held is not None:
            service.headers.release(held)


def _txn_of(frame: Commit) -> TxnId | None:
    try:
        check_txn(frame.txn, ErrorName.INVALID_ARGUMENT)
    except ServerError:
        return None  # (refused as it is decided)
    return TxnId(*frame.txn)


async def _answer(
    service: BrokerService, principal: Principal | None, frame: Commit
) -> CommitAnswer | Error:
    span = tracing.remote(tracing.BROKER, "end-txn", frame.traceparent)
    try:
        check_txn(frame.txn, ErrorName.INVALID_ARGUMENT)
        with tracing.current(span):
            state, why = await commit_here(
                service, principal, TxnId(*frame.txn), frame.ops, frame.digest, via="frame"
            )
    except ServerError as e:
        if span is not None:
            span.set_attribute("segtxn.error", e.name.value)
        tracing.end(span, e)
        return Error(error=e.name, message=e.message, request_id=frame.request_id)
    except Exception as e:  # the store away (ServiceNotReady), or a bug: answered all the same
        refusal = failure_frame("a commit frame", e, frame.request_id)
        if span is not None:
            span.set_attribute("segtxn.error", refusal.error)
        tracing.end(span, e)
        return refusal
    except BaseException as e:
        tracing.end(span, e)
        raise
    tracing.end(span)
    return CommitAnswer(request_id=frame.request_id, state=state.value, reason=why)
