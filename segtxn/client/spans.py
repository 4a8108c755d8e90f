"""The client's spans for the messages it sends and acknowledges (docs/tracing.md): one per
send, from the call to the broker's receipt, and one per acknowledgment, until its receipt;
each a child of its transaction's span (else of the current one), and each carried to the
broker in its frame's ``traceparent``, where the broker's own span
(:mod:`segtxn.broker.spans`) becomes its child. Their names and attributes.

They are apart from the producer and the consumer, which only start and end them, so what
a trace shows is decided in one place; with tracing off each helper returns at its first
test and a send pays nothing more.
"""

from __future__ import annotations

import asyncio

from segtxn import tracing
from segtxn.client.messages import MessageId
from segtxn.client.transaction import Transaction

__all__ = ["ack_span", "send_span", "send_span_ends"]


def send_span(topic: str, seq: int, txn: Transaction | None) -> tracing.Span | None:
    """Tracing on: the send's span, a child of its transaction's (else of the current
    span), from the call to the receipt; its context travels in the frame."""
    if not tracing.enabled():
        return None
    attributes: dict[str, tracing.AttributeValue] = {  # few: each costs on every send
        "messaging.destination.name": topic,
        "segtxn.seq": seq,
    }
    return _child_of(txn, f"send {topic}", tracing.SpanKind.PRODUCER, attributes)


def send_span_ends(span: tracing.Span, future: asyncio.Future[MessageId]) -> None:
    """A send's span ends with its receipt (its message id) or its failure."""
    if future.cancelled():
        tracing.end(span, asyncio.CancelledError())
    elif (error := future.exception()) is not None:
        tracing.end(span, error)
    else:
        message_id = future.result()
        span.set_attribute("messaging.message.id", f"{message_id.ledger_id}:{message_id.entry_id}")
        tracing.end(span)


def ack_span(
    message_id: MessageId, cumulative: bool, txn: Transaction | None
) -> tracing.Span | None:
    """Tracing on: an acknowledgment's span, a child of its transaction's (else of the
    current span), until the broker's receipt; its context travels in the ack frame."""
    if not tracing.enabled():
        return None
    attributes: dict[str, tracing.AttributeValue] = {
        "messaging.destination.name": message_id.topic,
        "messaging.message.id": f"{message_id.ledger_id}:{message_id.entry_id}",
        "segtxn.ack.cumulative": cumulative,
    }
    return _child_of(txn, f"ack {message_id.topic}", tracing.SpanKind.CLIENT, attributes)


def _child_of(
    txn: Transaction | None,
    name: str,
    kind: tracing.SpanKind,
    attributes: dict[str, tracing.AttributeValue],
) -> tracing.Span | None:
    """A span ``name``, a child of ``txn``'s (else of the current span), naming ``txn``
    (None: its parent is not sampled)."""
    if txn is not None:
        attributes["segtxn.txn.id"] = str(txn.id)
    return tracing.start(
        tracing.CLIENT,
        name,
        kind=kind,
        parent=None if txn is None else txn.span,
        attributes=attributes,
    )
