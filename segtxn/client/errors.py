"""Every error the client raises, in two trees.

- :class:`~segtxn.protocol.errors.ServerError`: a server refused (or the client could not
  reach one: ``ServiceNotReady``). The client raises the class named after the wire error
  (``TopicNotFound``, ``TransactionNotFound``, ...; all re-exported here), so callers catch
  the class; ``.name`` (the :class:`ErrorName`) stays for code that logs or maps it. Where a
  transport error caused it (a refused connection, a failed WebSocket handshake), it is
  raised ``from`` that error.
- :class:`ClientError`: what the client decides by itself (closed, timed out, cancelled,
  the end of a topic).

Every error says what a caller may do about it (``category``, STYLE 16): retry it, abort the
transaction it was part of, give up, or find out what happened (outcome unknown).
:class:`Timeout` is also the builtin :class:`TimeoutError`, as aiohttp's
``ServerTimeoutError`` is, so ``except TimeoutError`` catches every client timeout.
"""

from __future__ import annotations

from segtxn.protocol.errors import (
    ConsumerBusy,
    ErrorCategory,
    ErrorName,
    InvalidArgument,
    InvalidMessage,
    InvalidTopicName,
    InvalidTxnStatus,
    MessageTooLarge,
    MetadataError,
    MetadataStoreFull,
    NotAllowed,
    NotAuthorized,
    NotOwner,
    PersistenceError,
    PreconditionFailed,
    ProducerBusy,
    ServerError,
    ServiceNotReady,
    StoreAccessDenied,
    SubscriptionNotFound,
    TooManyRequests,
    TopicAlreadyExists,
    TopicBusy,
    TopicNotFound,
    TopicTerminatedError,
    TransactionConflict,
    TransactionNotFound,
    Unauthenticated,
    UnknownError,
)

__all__ = [
    "ClientClosed",
    "ClientError",
    "ConnectionLost",
    "ConsumerBusy",
    "ErrorCategory",
    "ErrorName",
    "InvalidArgument",
    "InvalidMessage",
    "InvalidTopicName",
    "InvalidTxnStatus",
    "MessageTooLarge",
    "MetadataError",
    "MetadataStoreFull",
    "NotAllowed",
    "NotAuthorized",
    "NotOwner",
    "OperationCancelled",
    "PersistenceError",
    "PreconditionFailed",
    "ProducerBusy",
    "ServerError",
    "ServiceNotReady",
    "StoreAccessDenied",
    "SubscriptionNotFound",
    "Timeout",
    "TooManyRequests",
    "TopicAlreadyExists",
    "TopicBusy",
    "TopicEnded",
    "TopicNotFound",
    "TopicTerminatedError",
    "TransactionConflict",
    "TransactionNotFound",
    "Unauthenticated",
    "UnknownError",
]


class ClientError(Exception):
    """Base of the client's own errors."""

    category: ErrorCategory = ErrorCategory.FATAL

    @property
    def retriable(self) -> bool:
        return self.category is ErrorCategory.RETRIABLE


class ClientClosed(ClientError):
    """The client, producer or consumer was closed."""


class Timeout(ClientError, TimeoutError):
    """A call did not complete within its timeout.

    ``category`` says what is known: ``RETRIABLE`` when nothing was done (no connection, no
    room to send, no message arrived), ``OUTCOME_UNKNOWN`` when the broker may still complete
    it (a send, an acknowledgment or a commit whose answer did not come in time),
    ``ABORTABLE`` when the transaction cannot commit as it stands. ``last_error`` is the
    last failure seen while retrying, if any (also its ``__cause__``).
    """

    def __init__(
        self,
        message: str,
        *,
        category: ErrorCategory = ErrorCategory.OUTCOME_UNKNOWN,
        last_error: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.category = category
        self.last_error = last_error


class ConnectionLost(ClientError):
    """A request on a broker's connection (an acknowledgment, a producer's send) has no
    answer and will get none: the connection was lost, and the broker could not be reached
    again (refused, no answer in time), or reconnecting failed for good (a refusal, a
    broker certificate the client does not trust: a :class:`CertificateError`). It fails
    then, rather than at its timeout, since nothing can answer it meanwhile. ``category``
    says what is known: ``OUTCOME_UNKNOWN`` when it was written (the broker may have
    applied it), ``RETRIABLE`` when it never left the client. Raised ``from`` the error the
    last attempt to reach the broker failed with."""

    def __init__(self, message: str, *, category: ErrorCategory) -> None:
        super().__init__(message)
        self.category = category


class OperationCancelled(ClientError):
    """A send or acknowledgment in a transaction was cancelled by its caller before its
    answer came. The broker may or may not have applied it (``OUTCOME_UNKNOWN``), so the
    transaction cannot commit: its commit aborts it and raises
    :class:`~segtxn.client.transaction.TransactionFailed` from this."""

    category = ErrorCategory.OUTCOME_UNKNOWN


class CertificateError(ClientError):
    """TLS failed: the server's certificate does not verify (signed by a CA the client does
    not trust, expired, for another host name), or the server refused the handshake (it
    wants a client certificate). The message says which; retrying cannot help."""


class TopicEnded(ClientError):
    """A reader has received everything: its topic is sealed, or it passed its ``end``."""
