"""The metadata store's error tree.

Every failure a caller of :class:`~segtxn.metastore.store.MetadataStore` can see is one of
these classes. A caller branches on the class (``BadVersion`` means "re-read and decide
again", ``StoreUnavailable`` means "the same request may succeed later", ``StoreFull``
means "no write will succeed until an operator frees space"), never on a
message. Foreign errors (gRPC, OS) are wrapped with ``raise ... from e`` at the backend edge
so that nothing above the backend imports a client library's exceptions.
"""

from __future__ import annotations


class MetadataStoreError(Exception):
    """Base of every metadata store error.

    Attributes:
        retriable: True when repeating the same request unchanged may succeed.
    """

    retriable: bool = False


class NotFound(MetadataStoreError):
    """The key does not exist (delete of a missing key, or a CAS on a deleted record)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} does not exist")
        self.key = key


class BadVersion(MetadataStoreError):
    """A compare-and-set lost: the record's version is not the expected one.

    Attributes:
        key: the key whose version did not match.
        expected: the version the caller expected.
        actual: the version found (0 when the key does not exist).
    """

    def __init__(self, key: str, expected: int, actual: int) -> None:
        super().__init__(f"key {key!r}: expected version {expected}, found {actual}")
        self.key = key
        self.expected = expected
        self.actual = actual


class AlreadyExists(BadVersion):
    """A create (``expected_version=MUST_NOT_EXIST``) found the key already present."""

    def __init__(self, key: str, actual: int) -> None:
        MetadataStoreError.__init__(self, f"key {key!r} already exists (version {actual})")
        self.key = key
        self.expected = 0
        self.actual = actual


class Compacted(MetadataStoreError):
    """A watch asked for history the store no longer keeps.

    The watch has ended. Re-list the range (which returns the revision it read at) and
    watch again from that revision + 1.

    Attributes:
        compacted_revision: the oldest revision the store still has history for.
    """

    def __init__(self, compacted_revision: int) -> None:
        super().__init__(
            f"history before revision {compacted_revision} was compacted: re-list and re-watch"
        )
        self.compacted_revision = compacted_revision


class SessionExpired(MetadataStoreError):
    """The session (lease) is gone: its ephemeral keys have been or will be deleted."""


class StoreUnavailable(MetadataStoreError):
    """The store could not be reached or did not answer in time; the outcome is unknown.

    A write that raised this may or may not have been applied: callers that need to know
    read back (a CAS retried after this error may fail with ``BadVersion`` because the first
    attempt landed).
    """

    retriable = True


class StoreFull(MetadataStoreError):
    """The store refused a write because its database reached its size quota (etcd's
    ``NOSPACE`` alarm, "mvcc: database space exceeded").

    The write was not applied. It is not transient: every write (and every new session)
    is refused until an operator frees space (compacts and defragments etcd, or raises
    its ``--quota-backend-bytes``) and disarms the alarm (``etcdctl alarm disarm``), so
    repeating the request soon does not help (``retriable`` is False). Every write is
    refused, deletes included (the store makes them as etcd transactions); reads, watches
    and session keep-alives still work. The ``memory://`` backend has no quota and never
    raises it.
    """


class StoreAccessDenied(MetadataStoreError):
    """The store refused who the client is: a wrong user name or password, no credentials
    where the store requires them, or a user without the permission for the request
    (etcd's authentication and roles). Not transient (``retriable`` is False): the
    credentials or the store's roles must change first. The request was not applied.
    """


class StoreClosed(MetadataStoreError):
    """The store object was closed; no more requests are accepted."""


class InvalidArgument(MetadataStoreError):
    """The request itself is malformed; repeating it can never succeed."""


class InvalidKey(InvalidArgument):
    """A key, prefix, range bound, index name or index key is not acceptable."""


class TooLarge(InvalidArgument):
    """A value or a whole atomic step exceeds the store's size limit."""


class TooManyOperations(InvalidArgument):
    """An atomic step needs more physical operations than one store transaction allows."""
