"""Error names on the wire, shaped like Pulsar's ``ServerError`` where one fits.

Every failure a client can see carries one of these names, in a JSON body
``{"error": NAME, "message": ...}`` (REST) or an ``Error`` frame (WebSocket). Clients branch
on the name, never on the message.
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
    METADATA_STORE_FULL = "MetadataStoreFull"
    """The metadata store reached its size quota (etcd's NOSPACE alarm) and refuses every
    write until an operator frees space: a server condition (503), but not one that passes
    by itself, so not retriable."""
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
}
_ABORTABLE = {
    ErrorName.TRANSACTION_CONFLICT,
    ErrorName.INVALID_TXN_STATUS,
    ErrorName.TRANSACTION_NOT_FOUND,
}


class ServerError(Exception):
    """An error with a wire name; raised by servers, and by the client when a server says so."""

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
