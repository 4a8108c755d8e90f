"""WebSocket frames of the data plane: typed msgpack messages (see docs/protocol.md).

Each WebSocket binary message carries exactly one frame. Frames are msgspec Structs with a
``type`` tag; a message that does not decode as a frame the endpoint accepts is answered
with an ``Error`` frame named ``InvalidMessage``, and the connection stays open.
"""

from __future__ import annotations

import msgspec

MessageIdT = tuple[int, int]
"""(ledger id, entry id) of a message within one topic or segment."""


class Frame(msgspec.Struct, kw_only=True, tag_field="type", forbid_unknown_fields=True, gc=False):
    """Base of every frame.

    Frames are not tracked by the garbage collector (``gc=False``): they hold only
    numbers, strings, bytes and lists or maps of those and of other frames, so none can
    be part of a reference cycle, and one or more is made for every message each way.
    Untracked, they no longer count towards the collections of the youngest generation,
    nor are walked by them: 4-5 % fewer collections per message in bench/peer.py's loops
    of 100 (an in-process probe counting them with ``gc.callbacks``). A field that could
    hold an object referring back to its frame would make this a leak."""


# ---------------------------------------------------------------- producer


class Send(Frame, tag="send", omit_defaults=True):
    seq: int
    """Producer-assigned, strictly increasing: the broker drops a seq it has already stored
    (de-duplication across reconnects) and answers with the original message id."""
    payload: bytes
    key: str | None = None
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    event_time_ms: int | None = None
    txn: tuple[int, int] | None = None
    """(most, least) of the transaction this message belongs to, if any."""
    traceparent: str | None = None
    """W3C Trace Context of the client's span for this send (tracing on: docs/tracing.md);
    fields left at their defaults are not encoded, so a frame without it is what a broker
    without tracing reads."""


class SendBatch(Frame, tag="send_batch"):
    """Several sends in one WebSocket message (each is still stored as its own entry)."""

    sends: list[Send]


class Receipt(Frame, tag="receipt"):
    seq: int
    message_id: MessageIdT
    duplicate: bool = False


class ReceiptBatch(Frame, tag="receipt_batch"):
    """Several receipts in one WebSocket message, in the order they were written (a broker
    sends them together when they are ready together: one message instead of one each)."""

    receipts: list[Receipt]


class Commit(Frame, tag="commit", omit_defaults=True):
    """Commit transaction ``txn`` here in one step (the one-step commit: docs/protocol.md),
    as ``POST /txn/v2/{txn}/commit`` would, on a producer connection the client already
    holds to this broker. Answered with :class:`CommitAnswer` or an :class:`Error`, both
    carrying ``request_id``; the connection's other frames go on meanwhile."""

    request_id: int
    txn: tuple[int, int]
    """(most, least) of a v5 transaction."""
    ops: int
    """How many distinct operations it made (:mod:`segtxn.protocol.txnops`)."""
    digest: int
    """Their order-free digest (:func:`segtxn.protocol.txnops.digest`)."""
    traceparent: str | None = None
    """W3C Trace Context of the client's commit span (tracing on: docs/tracing.md)."""


class CommitAnswer(Frame, tag="commit_answer", omit_defaults=True):
    request_id: int
    state: str
    """``COMMITTED``, or ``OPEN``: nothing was decided here (the client ends the
    transaction at its coordinator)."""
    reason: str = ""
    """Why not, with ``OPEN``."""


class ProducerReady(Frame, tag="producer_ready"):
    producer_name: str
    last_sequence_id: int
    """The highest seq the broker has stored for this producer name (-1: none)."""
    max_message_bytes: int


# ---------------------------------------------------------------- consumer / reader


class Flow(Frame, tag="flow"):
    """Grant the broker ``permits`` more messages."""

    permits: int


class Ack(Frame, tag="ack", omit_defaults=True):
    message_ids: list[MessageIdT]
    cumulative: bool = False
    request_id: int = 0
    """Non-zero: the broker answers with AckReceipt(request_id) once the ack is durable
    (for a transactional ack: once it is recorded as pending on the transaction)."""
    txn: tuple[int, int] | None = None
    epoch: int | None = None
    """The delivery epoch of the acknowledged messages: on an ordered subscription a
    transaction may not acknowledge messages delivered before the latest rewind
    (TransactionConflict; they are being delivered again)."""
    traceparent: str | None = None
    """W3C Trace Context of the client's span for the (first) acknowledgment in this frame
    (tracing on: docs/tracing.md)."""


class Nack(Frame, tag="nack"):
    """Ask for redelivery of these messages (negative acknowledgment)."""

    message_ids: list[MessageIdT]
    request_id: int = 0
    """Non-zero: answer with Rewind(request_id) once redelivery starts (ordered
    subscriptions: everything from the earliest unacknowledged message comes again)."""


class Redeliver(Frame, tag="redeliver"):
    """Deliver this consumer's unacknowledged messages again, once ``txn`` (if given) no
    longer holds acknowledgments on the subscription (its outcome is applied). The broker
    answers with Rewind(request_id). A client sends it after a transaction in which it
    acknowledged messages did not commit (Pulsar's redeliverUnacknowledgedMessages)."""

    request_id: int
    txn: tuple[int, int] | None = None


class ConsumerReady(Frame, tag="consumer_ready"):
    consumer_name: str
    subscription: str
    active: bool
    """False for a Failover standby: it gets messages only when it becomes active."""
    epoch: int = 0
    """The subscription's delivery epoch (see Rewind)."""


class Message(Frame, tag="message"):
    message_id: MessageIdT
    payload: bytes
    key: str | None = None
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    publish_time_ms: int = 0
    event_time_ms: int | None = None
    producer_name: str = ""
    sequence_id: int = -1
    redelivery_count: int = 0
    epoch: int = 0
    """The subscription's delivery epoch (see Rewind); 0 from a reader."""


class MessageBatch(Frame, tag="message_batch"):
    """Several messages in one WebSocket message, in delivery order (a broker sends them
    together when they are ready together); each counts as one delivery, as if it had come
    in its own frame."""

    messages: list[Message]


class AckReceipt(Frame, tag="ack_receipt"):
    request_id: int


class ActiveChange(Frame, tag="active_change"):
    active: bool


class Rewind(Frame, tag="rewind"):
    """Delivery starts again: the messages that follow begin at the earliest unacknowledged
    position and go forward in position order (ordered subscriptions), so every message
    sent before this frame and not yet handed to the application is stale and is dropped
    by the client. ``epoch`` counts the subscription's rewinds; ``request_id`` is non-zero
    when this answers the client's Redeliver or Nack."""

    epoch: int
    request_id: int = 0


class EndOfTopic(Frame, tag="end_of_topic"):
    """The topic is sealed and everything in it has been delivered."""


# ---------------------------------------------------------------- both


class Error(Frame, tag="error"):
    error: str
    """An ErrorName value."""
    message: str
    seq: int | None = None
    """For a producer: the send that failed."""
    request_id: int | None = None
    """For a request (a consumer's, a producer's commit): the request that failed."""
    redirect: str | None = None


ProducerInput = Send | SendBatch | Commit
ConsumerInput = Flow | Ack | Nack | Redeliver
ServerFrame = (
    Receipt
    | ReceiptBatch
    | CommitAnswer
    | ProducerReady
    | ConsumerReady
    | Message
    | MessageBatch
    | AckReceipt
    | ActiveChange
    | Rewind
    | EndOfTopic
    | Error
)

_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode
producer_input = msgspec.msgpack.Decoder(ProducerInput)
consumer_input = msgspec.msgpack.Decoder(ConsumerInput)
server_frame = msgspec.msgpack.Decoder(ServerFrame)

MAX_BATCHED_PAYLOAD = 1024 * 1024
"""Messages sent together in one :class:`MessageBatch` carry at most this many payload
bytes (a single larger message travels alone)."""


def unbatch(frame: ServerFrame) -> list[ServerFrame]:
    """The frames a server frame stands for: a batch's receipts or messages, in order;
    any other frame alone."""
    if isinstance(frame, ReceiptBatch):
        return list(frame.receipts)
    if isinstance(frame, MessageBatch):
        return list(frame.messages)
    return [frame]


def coalesce(queued: list[Frame]) -> list[Frame]:
    """``queued`` with each run of two or more consecutive receipts (messages) merged into
    one :class:`ReceiptBatch` (:class:`MessageBatch`, up to :data:`MAX_BATCHED_PAYLOAD`
    bytes of payload); the order of everything is kept, so :func:`unbatch` gives back
    ``queued``."""
    out: list[Frame] = []
    run: list[Frame] = []
    size = 0

    def flush() -> None:
        nonlocal size
        if len(run) == 1:
            out.append(run[0])
        elif run and isinstance(run[0], Receipt):
            out.append(ReceiptBatch(receipts=[f for f in run if isinstance(f, Receipt)]))
        elif run:
            out.append(MessageBatch(messages=[f for f in run if isinstance(f, Message)]))
        run.clear()
        size = 0

    for frame in queued:
        if isinstance(frame, Receipt):
            if run and not isinstance(run[0], Receipt):
                flush()
            run.append(frame)
        elif isinstance(frame, Message):
            if run and (
                not isinstance(run[0], Message) or size + len(frame.payload) > MAX_BATCHED_PAYLOAD
            ):
                flush()
            run.append(frame)
            size += len(frame.payload)
        else:
            flush()
            out.append(frame)
    flush()
    return out
