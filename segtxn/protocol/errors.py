"""Error names on the wire, shaped like Pulsar's ``ServerError`` where one fits.

Every failure a client can see carries one of these names, in a JSON body
``{"error": NAME, "message": ...}`` (REST) or an ``Error`` frame (WebSocket). Clients branch
on the name, never on the message: in Python, on the class. Each name has a subclass of
:class:`ServerError` named after it (``except TransactionNotFound``), which the client
builds from the wire with :func:`server_error`; each carries the name's category (what a
caller should do: retry, abort the transaction, give up, or find out; Kafka KIP-1050).
Servers may raise the base class with a name: only the name crosses the wire.
"""

from __future__ import annotations

import enum


class ErrorName(enum.StrEnum):
    UNKNOWN = "UnknownError"
    METADATA = "MetadataError"
    PERSISTENCE = "PersistenceError"
    SERVICE_NOT_READY = "ServiceNotReady"
    TOPIC_NOT_FOUND = "TopicNotFound"
    TOPIC_EXISTS = "TopicAlreadyExists"
    SUBSCRIPTION_NOT_FOUND = "SubscriptionNotFound"
    CONSUMER_BUSY = "ConsumerBusy"
    PRODUCER_BUSY = "ProducerBusy"
    TOPIC_TERMINATED = "TopicTerminatedError"
    INVALID_TOPIC_NAME = "InvalidTopicName"
    INVALID_MESSAGE = "InvalidMessage"
    MESSAGE_TOO_LARGE = "MessageTooLarge"
    NOT_ALLOWED = "NotAllowed"
    NOT_OWNER = "NotOwner"
    TOO_MANY_REQUESTS = "TooManyRequests"
    INVALID_TXN_STATUS = "InvalidTxnStatus"
    TRANSACTION_CONFLICT = "TransactionConflict"
    TRANSACTION_NOT_FOUND = "TransactionNotFound"
    INVALID_ARGUMENT = "InvalidArgument"
    TOPIC_BUSY = "TopicBusy"
    """A split or merge of the topic is already in progress."""
    PRECONDITION_FAILED = "PreconditionFailed"
    """A conditional request's precondition (``DELETE ...?ifProperty=...``) does not hold on
    the topic as it is: nothing was changed (HTTP's 412)."""
    METADATA_STORE_FULL = "MetadataStoreFull"
    """The metadata store reached its size quota (etcd's NOSPACE alarm) and refuses every
    write until an operator frees space: a server condition (503), but not one that passes
    by itself, so not retriable."""
    STORE_ACCESS_DENIED = "StoreAccessDenied"
    """The metadata store refuses the *server's* credentials or permissions (its etcd
    user's role revoked, its password changed): a server condition (503) that lasts until
    an operator acts, so not retriable."""
    UNAUTHENTICATED = "Unauthenticated"
    """No credentials, or credentials the server cannot verify (missing, malformed, expired,
    signed with another key): 401. Not retriable: the same token fails the same way."""
    NOT_AUTHORIZED = "NotAuthorized"
    """The caller's role may not do this (its policy grants no such action on the tenant or
    namespace, or the transaction belongs to another role): 403."""

    @classmethod
    def parse(cls, name: str) -> ErrorName:
        """The name read off the wire; one this version does not know (a newer server's)
        is ``UnknownError``."""
        try:
            return cls(name)
        except ValueError:
            return cls.UNKNOWN

    @property
    def http_status(self) -> int:
        return _STATUS.get(self, 500)


_STATUS = {
    ErrorName.SERVICE_NOT_READY: 503,
    ErrorName.METADATA_STORE_FULL: 503,
    ErrorName.STORE_ACCESS_DENIED: 503,
    ErrorName.TOPIC_NOT_FOUND: 404,
    ErrorName.SUBSCRIPTION_NOT_FOUND: 404,
    ErrorName.TRANSACTION_NOT_FOUND: 404,
    ErrorName.TOPIC_EXISTS: 409,
    ErrorName.CONSUMER_BUSY: 409,
    ErrorName.PRODUCER_BUSY: 409,
    ErrorName.TRANSACTION_CONFLICT: 409,
    ErrorName.INVALID_TXN_STATUS: 409,
    ErrorName.TOPIC_TERMINATED: 409,
    ErrorName.TOPIC_BUSY: 409,
    ErrorName.PRECONDITION_FAILED: 412,
    ErrorName.INVALID_TOPIC_NAME: 400,
    ErrorName.INVALID_MESSAGE: 400,
    ErrorName.INVALID_ARGUMENT: 400,
    ErrorName.MESSAGE_TOO_LARGE: 413,
    ErrorName.NOT_ALLOWED: 405,
    ErrorName.NOT_OWNER: 307,
    ErrorName.TOO_MANY_REQUESTS: 429,
    ErrorName.UNAUTHENTICATED: 401,
    ErrorName.NOT_AUTHORIZED: 403,
}


class ErrorCategory(enum.StrEnum):
    """What a caller should do about an error (Kafka KIP-1050's categories)."""

    RETRIABLE = "retriable"
    """Nothing happened that counts; the same call may succeed later."""
    ABORTABLE = "abortable"
    """The transaction it was part of cannot commit: abort it and start again."""
    FATAL = "fatal"
    """Retrying the same call will not help (a bad name, a missing topic, a closed client)."""
    OUTCOME_UNKNOWN = "outcome-unknown"
    """It may or may not have taken effect (a send or commit whose answer never came)."""


_RETRIABLE = {
    ErrorName.SERVICE_NOT_READY,
    ErrorName.NOT_OWNER,
    ErrorName.TOO_MANY_REQUESTS,
    ErrorName.METADATA_STORE_FULL,  # it passes once an operator frees space: no restart
}
_ABORTABLE = {
    ErrorName.TRANSACTION_CONFLICT,
    ErrorName.INVALID_TXN_STATUS,
    ErrorName.TRANSACTION_NOT_FOUND,
}


class ServerError(Exception):
    """An error with a wire name; raised by servers, and by the client when a server says so.

    The client always raises the subclass named after ``name`` (:class:`TopicNotFound`,
    ...), so ``except TopicNotFound`` and ``e.name is ErrorName.TOPIC_NOT_FOUND`` agree; a
    server may raise the base class with any name.
    """

    name: ErrorName

    def __init__(self, name: ErrorName, message: str, *, redirect: str | None = None) -> None:
        super().__init__(f"{name.value}: {message}")
        self.name = name
        self.message = message
        self.redirect = redirect
        """For NotOwner: the URL of the broker that serves the topic."""

    @property
    def retriable(self) -> bool:
        return self.name in _RETRIABLE

    @property
    def category(self) -> ErrorCategory:
        """Retriable (the service is busy or moving), abortable (a transaction error: abort
        and start again), else fatal: an answer is never of unknown outcome."""
        if self.name in _RETRIABLE:
            return ErrorCategory.RETRIABLE
        if self.name in _ABORTABLE:
            return ErrorCategory.ABORTABLE
        return ErrorCategory.FATAL


_CLASSES: dict[ErrorName, type[NamedServerError]] = {}


class NamedServerError(ServerError):
    """The base of the classes named after one error name: built from a message alone
    (``TopicNotFound("topic://a/b/c")``). Each subclass sets ``name`` and is registered, one
    class per name, for :func:`server_error`."""

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if cls.name in _CLASSES:
            raise TypeError(f"{cls.name.value} already has a class: {_CLASSES[cls.name]}")
        _CLASSES[cls.name] = cls

    def __init__(self, message: str, *, redirect: str | None = None) -> None:
        super().__init__(self.name, message, redirect=redirect)

    def __reduce__(self) -> tuple[type[NamedServerError], tuple[str]]:
        return type(self), (self.message,)


def server_error(name: ErrorName, message: str, *, redirect: str | None = None) -> ServerError:
    """The exception for ``name``: an instance of the class named after it."""
    return _CLASSES[name](message, redirect=redirect)


class UnknownError(NamedServerError):
    """Fatal. An unexpected server failure (its message names an incident id to find in
    the server's log), or an error name this client does not know (a newer server's)."""

    name = ErrorName.UNKNOWN


class MetadataError(NamedServerError):
    """Fatal. The metadata store refused a request in a way the server did not expect."""

    name = ErrorName.METADATA


class PersistenceError(NamedServerError):
    """Fatal. A topic's stored data is damaged or missing; it must be restored."""

    name = ErrorName.PERSISTENCE


class ServiceNotReady(NamedServerError):
    """Retriable. The service is starting, moving a topic, cannot reach its store or a
    peer, or could not be reached (the client says so when no broker answers)."""

    name = ErrorName.SERVICE_NOT_READY


class TopicNotFound(NamedServerError):
    """Fatal. No such topic."""

    name = ErrorName.TOPIC_NOT_FOUND


class TopicAlreadyExists(NamedServerError):
    """Fatal. Creating a topic that exists."""

    name = ErrorName.TOPIC_EXISTS


class SubscriptionNotFound(NamedServerError):
    """Fatal. No such subscription on the topic."""

    name = ErrorName.SUBSCRIPTION_NOT_FOUND


class ConsumerBusy(NamedServerError):
    """Fatal. Another consumer holds the exclusive subscription."""

    name = ErrorName.CONSUMER_BUSY


class ProducerBusy(NamedServerError):
    """Fatal. A producer of that name is connected already."""

    name = ErrorName.PRODUCER_BUSY


class TopicTerminatedError(NamedServerError):
    """Fatal. The topic (or segment) is sealed: it takes no more writes."""

    name = ErrorName.TOPIC_TERMINATED


class InvalidTopicName(NamedServerError):
    """Fatal. A topic name, tenant or namespace that no topic can have. (Not
    :class:`segtxn.protocol.names.InvalidTopicName`, the parser's ``ValueError``: the client
    turns that into this.)"""

    name = ErrorName.INVALID_TOPIC_NAME


class InvalidMessage(NamedServerError):
    """Fatal. A frame or message the endpoint does not take."""

    name = ErrorName.INVALID_MESSAGE


class MessageTooLarge(NamedServerError):
    """Fatal. A payload (or its key and properties) larger than the broker accepts."""

    name = ErrorName.MESSAGE_TOO_LARGE


class NotAllowed(NamedServerError):
    """Fatal. The operation does not apply here (e.g. draining a broker that runs without
    replication)."""

    name = ErrorName.NOT_ALLOWED


class NotOwner(NamedServerError):
    """Retriable. Another broker serves the topic: ``redirect`` is its URL (the client
    follows it by itself)."""

    name = ErrorName.NOT_OWNER


class TooManyRequests(NamedServerError):
    """Retriable. A limit on concurrent work was reached; try again later."""

    name = ErrorName.TOO_MANY_REQUESTS


class InvalidTxnStatus(NamedServerError):
    """Abortable. The transaction is not open any more (it timed out, or was committed or
    aborted)."""

    name = ErrorName.INVALID_TXN_STATUS


class TransactionConflict(NamedServerError):
    """Abortable. The transaction conflicts with another (an acknowledgment another
    transaction holds)."""

    name = ErrorName.TRANSACTION_CONFLICT


class TransactionNotFound(NamedServerError):
    """Abortable. The coordinator does not know the transaction (never begun, or ended
    and forgotten)."""

    name = ErrorName.TRANSACTION_NOT_FOUND


class InvalidArgument(NamedServerError):
    """Fatal. A parameter out of range or malformed; the message says which."""

    name = ErrorName.INVALID_ARGUMENT


class TopicBusy(NamedServerError):
    """Fatal as a category (the same call fails while it lasts); a split or merge of the
    topic is in progress, so callers that plan layout changes wait and plan again."""

    name = ErrorName.TOPIC_BUSY


class PreconditionFailed(NamedServerError):
    """Fatal. The topic does not satisfy the precondition the request named (a property
    with another value, or none): nothing was changed. The same call fails while the topic
    stays as it is; read it again and decide again."""

    name = ErrorName.PRECONDITION_FAILED


class MetadataStoreFull(NamedServerError):
    """Retriable. The metadata store reached its size quota (etcd's NOSPACE alarm) and
    refuses every write until an operator frees space; nothing was done. It does not pass
    by itself, but it passes without restarting anything: once space is freed the same
    call succeeds, so the client retries it within the call's time limit like
    ServiceNotReady (a Timeout's ``last_error`` then names it), and a caller that gets it
    retries later rather than giving up."""

    name = ErrorName.METADATA_STORE_FULL


class StoreAccessDenied(NamedServerError):
    """Fatal. The metadata store refuses the server's own credentials or permissions; an
    operator must restore them (the message has the store's reason)."""

    name = ErrorName.STORE_ACCESS_DENIED


class Unauthenticated(NamedServerError):
    """Fatal. No credentials, or ones the server does not accept (expired, signed with
    another key); the message says which (docs/security.md)."""

    name = ErrorName.UNAUTHENTICATED


class NotAuthorized(NamedServerError):
    """Fatal. The caller's role may not do this (on this tenant and namespace, or in another
    role's transaction)."""

    name = ErrorName.NOT_AUTHORIZED


__all__ = [
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
    "NamedServerError",
    "NotAllowed",
    "NotAuthorized",
    "NotOwner",
    "PersistenceError",
    "PreconditionFailed",
    "ProducerBusy",
    "ServerError",
    "ServiceNotReady",
    "StoreAccessDenied",
    "SubscriptionNotFound",
    "TooManyRequests",
    "TopicAlreadyExists",
    "TopicBusy",
    "TopicNotFound",
    "TopicTerminatedError",
    "TransactionConflict",
    "TransactionNotFound",
    "Unauthenticated",
    "UnknownError",
    "server_error",
]
