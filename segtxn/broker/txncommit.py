"""``POST /txn/v2/{txn}/commit`` on a broker: the one-step commit (docs/protocol.md).

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
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web

from segtxn import tracing
from segtxn.auth import check_owner, principal_of
from segtxn.boundary import read_json, server_span
from segtxn.broker.http import SERVICE, json_errors
from segtxn.broker.txn.commits import CommitUnknown
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.limits import MAX_I64
from segtxn.protocol.txn import TxnId, TxnState

log = logging.getLogger(__name__)
MAX_OPS = MAX_I64
_DIGEST_LIMIT = 1 << 64


def routes() -> list[web.RouteDef]:
    return [web.post("/txn/v2/{txn}/commit", commit_txn)]


def _count(body: Any, field: str, limit: int, lo: int) -> int:
    value = body.get(field) if isinstance(body, dict) else None
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
    ops = _count(body, "ops", MAX_OPS, 1)
    digest = _count(body, "digest", _DIGEST_LIMIT, 0)
    if not txn.is_v5:
        raise ServerError(
            ErrorName.NOT_ALLOWED, f"{txn} is a v4 transaction: its coordinator ends it"
        )
    tracing.annotate({"segtxn.txn.id": str(txn), "segtxn.txn.action": "COMMIT"})
    service = request.app[SERVICE]
    metrics = service.metrics.txn_one_step_commits
    header, version = await service.headers.get(txn)
    if header is None:
        raise ServerError(ErrorName.TRANSACTION_NOT_FOUND, f"no transaction {txn}")
    check_owner(principal_of(request), header.owner, f"transaction {txn}")
    if header.state is TxnState.COMMITTED:
        return web.json_response({"state": TxnState.COMMITTED.value})
    if header.state is TxnState.ABORTED:
        raise ServerError(ErrorName.INVALID_TXN_STATUS, f"{txn} is already ABORTED; cannot COMMIT")
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
            metrics.add(1, {"answer": "committed"})
            return web.json_response({"state": TxnState.COMMITTED.value})
        why = answer.reason
    metrics.add(1, {"answer": "not_here"})
    return web.json_response({"state": TxnState.OPEN.value, "reason": why})
