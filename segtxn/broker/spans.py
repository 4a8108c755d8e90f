"""The broker's spans (docs/tracing.md): one per traced send and ack, each a child of the
client span named in its frame's ``traceparent``, and one per materialization of a traced
END_TXN on a segment (its writes) or a subscription (its acks), the root of a trace of its
own linked to that END_TXN; their names and attributes.

Only what carries a trace context gets a span (a frame's ``traceparent``, a final header's
``trace``): the check is the first thing each helper does, so with tracing off a send pays
one attribute test.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

from segtxn import tracing
from segtxn.ledger import Position
from segtxn.protocol.errors import ServerError
from segtxn.protocol.frames import Ack, Send
from segtxn.protocol.txn import TxnId, TxnState
from segtxn.topics.transactions import TxnHeader


def send_span(topic: object, producer: str, send: Send) -> tracing.Span | None:
    """The span of storing ``send`` on ``topic`` (a topic or segment), until its receipt."""
    if send.traceparent is None:
        return None
    attributes: dict[str, tracing.AttributeValue] = {  # few: each costs on every send
        "messaging.destination.name": str(topic),
        "segtxn.producer": producer,
        "segtxn.seq": send.seq,
    }
    if send.txn is not None:
        attributes["segtxn.txn.id"] = f"{send.txn[0]:x}:{send.txn[1]:x}"
    return tracing.remote(tracing.BROKER, f"send {topic}", send.traceparent, attributes=attributes)


def send_span_ends(span: tracing.Span, outcome: tuple[Position, bool] | ServerError) -> None:
    """The send was stored (its position; ``segtxn.duplicate``) or refused (its error)."""
    if isinstance(outcome, ServerError):
        span.set_attribute("segtxn.error", outcome.name.value)
        tracing.end(span, outcome)
        return
    position, duplicate = outcome
    span.set_attribute("messaging.message.id", f"{position.ledger_id}:{position.entry_id}")
    span.set_attribute("segtxn.duplicate", duplicate)
    tracing.end(span)


def ack_span(topic: object, subscription: str, frame: Ack) -> tracing.Span | None:
    """The span of applying (in a transaction: recording as pending) an ack frame."""
    if frame.traceparent is None:
        return None
    attributes: dict[str, tracing.AttributeValue] = {
        "messaging.destination.name": str(topic),
        "messaging.destination.subscription.name": subscription,
        "messaging.batch.message_count": len(frame.message_ids),
        "segtxn.ack.cumulative": frame.cumulative,
    }
    if frame.txn is not None:
        attributes["segtxn.txn.id"] = f"{frame.txn[0]:x}:{frame.txn[1]:x}"
    return tracing.remote(tracing.BROKER, f"ack {topic}", frame.traceparent, attributes=attributes)


def materialization_span(
    segment: object,
    txn: TxnId,
    outcome: TxnState,
    header: TxnHeader | None,
    *,
    subscription: str | None = None,
    entries: int | None = None,
) -> AbstractContextManager[tracing.Span | None]:
    """The current span of applying ``txn``'s outcome on ``segment`` (its writes), or on
    one of its subscriptions (its acks), linked to the END_TXN in ``header.trace``; none
    when that END_TXN was not traced."""
    if header is None or header.trace is None or not tracing.enabled():
        return contextlib.nullcontext()
    attributes: dict[str, tracing.AttributeValue] = {
        "segtxn.segment": str(segment),
        "segtxn.txn.id": str(txn),
        "segtxn.txn.outcome": outcome.value,
    }
    if subscription is not None:
        attributes["messaging.destination.subscription.name"] = subscription
    if entries is not None:
        attributes["segtxn.entries"] = entries
    part = "writes" if subscription is None else "acks"
    return tracing.linked(
        tracing.BROKER,
        f"materialize {part} {segment}",
        header.trace,
        attributes,
    )
