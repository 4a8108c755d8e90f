"""The backend contract: a small, etcd-shaped, multi-version key-value engine.

:class:`~segtxn.metastore.store.MetadataStore` implements everything PIP-471 asks of a
metadata store (versioned records, sequential keys, secondary indexes kept in step with
their records, resumable watches, sessions) *once*, on top of this interface. A backend is
an :class:`Engine`: the in-process ``memory`` engine and the ``etcd`` engine implement the
same few primitives with the same semantics, and the conformance suite holds both to them.

Semantics every engine provides (etcd's, exactly):

- One global **revision** counter. Every successful write transaction increments it by one;
  every key written in that transaction gets it as its ``mod_revision`` (and as its
  ``create_revision`` if it did not exist). A missing key has ``mod_revision == 0``.
- :meth:`Engine.txn` evaluates all compares against one consistent state, then applies
  either the success or the failure operations atomically. A transaction may not write the
  same key twice, and each of its three lists holds at most :data:`MAX_TXN_OPS` entries.
- Watches deliver every event with a revision ``>= start_revision`` in revision order, all
  events of one revision in the order the transaction wrote them. A watch never skips an
  event: it either delivers it or fails with ``Compacted`` (history gone),
  ``StoreUnavailable`` (connection lost; the caller resumes from a revision it chooses) or
  ``StoreAccessDenied`` (the store refuses this client the range, for now or for good).
- A **multiplexed** stream (:meth:`Engine.watch_many`) carries many watches, each with its
  own id and start revision, with the same per-watch guarantees; a watch whose start is
  compacted ends alone (a :class:`WatchReply` with ``compacted``), the others go on.
- Leases: keys written with a lease are deleted, in one revision, when the lease expires or
  is revoked.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from segtxn.metastore.errors import StoreAccessDenied

MAX_TXN_OPS = 128
"""etcd's default ``--max-txn-ops``: compares, success ops and failure ops, each."""

MAX_REQUEST_BYTES = 1536 * 1024
"""etcd's default ``--max-request-bytes`` (1.5 MiB) for one request."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class RangeResult:
    kvs: list[KeyValue]
    revision: int
    """The store revision the range was read at."""
    more: bool
    """True when ``limit`` cut the result short."""


@dataclass(frozen=True, slots=True)
class ModEquals:
    """Compare: ``key``'s mod_revision equals ``revision`` (0 means "does not exist")."""

    key: bytes
    revision: int


@dataclass(frozen=True, slots=True)
class RangeUnchangedSince:
    """Compare: no key in ``[lo, hi)`` has a mod_revision greater than ``revision``."""

    lo: bytes
    hi: bytes
    revision: int


Compare = ModEquals | RangeUnchangedSince


@dataclass(frozen=True, slots=True)
class PutOp:
    key: bytes
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class DeleteOp:
    """Delete ``key``, or every key in ``[key, range_end)`` when ``range_end`` is set."""

    key: bytes
    range_end: bytes | None = None


@dataclass(frozen=True, slots=True)
class GetOp:
    """Read one key (only useful in the failure branch, to learn why a compare failed)."""

    key: bytes


TxnOp = PutOp | DeleteOp | GetOp


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    """The revision the transaction produced (or read at, when nothing was written)."""
    results: list[KeyValue | int | None]
    """Per op of the branch that ran: ``GetOp`` -> the KeyValue or None; ``DeleteOp`` ->
    the number of keys deleted; ``PutOp`` -> None."""


class EventKind(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class RawEvent:
    kind: EventKind
    key: bytes
    value: bytes
    """Empty for DELETE."""
    mod_revision: int
    """The revision of the change (for DELETE, the revision that deleted the key)."""
    create_revision: int
    lease: int = 0


WatchStream = AbstractAsyncContextManager[AsyncIterator[Sequence[RawEvent]]]


@dataclass(frozen=True, slots=True)
class WatchReply:
    """What a multiplexed stream says about one of its watches."""

    watch_id: int
    events: Sequence[RawEvent] = ()
    """A non-empty batch in revision order (empty when ``compacted`` is set)."""
    compacted: int = 0
    """When > 0: the watch's start revision is older than the retained history (this is
    the oldest revision still kept). That watch has ended and says nothing more."""


class WatchMux(ABC):
    """Many watches on one stream, as etcd's Watch RPC carries them (a ``WatchCreateRequest``
    with its own ``watch_id``, a ``WatchCancelRequest``; every response names its watch).

    A stream breaks as a whole: then :meth:`replies` raises ``StoreUnavailable`` and the
    caller opens a new stream and creates each watch again from the first revision it has
    not seen. Watch ids are the caller's: positive, never reused within one stream.
    """

    @abstractmethod
    async def create(self, watch_id: int, lo: bytes, hi: bytes | None, start_revision: int) -> None:
        """Start watching ``lo`` (``hi=None``) or ``[lo, hi)`` from ``start_revision``
        (inclusive). Returns once the request is sent: the start revision is explicit, so
        no change is missed whenever the store gets to it.

        Raises:
            StoreUnavailable: the stream broke (:meth:`replies` raises it too).
        """

    @abstractmethod
    async def cancel(self, watch_id: int) -> None:
        """Stop a watch. Replies already on their way may still name it (ignore them).

        Raises:
            StoreUnavailable: the stream broke (:meth:`replies` raises it too).
        """

    @abstractmethod
    def replies(self) -> AsyncIterator[WatchReply]:
        """Every watch's events and per-watch compactions, as they come (one consumer).

        Raises:
            StoreUnavailable: the stream broke; every watch on it has ended.
            StoreClosed: the engine was closed.
        """


WatchMuxStream = AbstractAsyncContextManager[WatchMux]


class Engine(ABC):
    """A backend of the metadata store. See the module docstring for the semantics."""

    @property
    def denied(self) -> StoreAccessDenied | None:
        """The refusal of this client's credentials or permissions the store last answered
        with, until a call succeeds again (a user's role revoked, a password changed after
        start-up); None while access works. Servers answer 503 ``StoreAccessDenied`` and
        say not ready meanwhile. Only an engine with credentials has one."""
        return None

    @abstractmethod
    async def range(self, lo: bytes, hi: bytes | None = None, *, limit: int = 0) -> RangeResult:
        """Read ``lo`` alone (``hi=None``) or ``[lo, hi)`` in key order.

        Raises:
            StoreUnavailable: the engine could not be reached.
        """

    @abstractmethod
    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[TxnOp],
        failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        """Run one atomic transaction.

        Raises:
            TooManyOperations: a list is longer than :data:`MAX_TXN_OPS`, or a key is
                written twice.
            TooLarge: the request exceeds :data:`MAX_REQUEST_BYTES`.
            SessionExpired: a ``PutOp`` names a lease that does not exist.
            StoreUnavailable: the outcome is unknown (it may have been applied).
        """

    @abstractmethod
    def watch(self, lo: bytes, hi: bytes | None, start_revision: int) -> WatchStream:
        """Watch ``lo`` (``hi=None``) or ``[lo, hi)`` from ``start_revision`` (inclusive).

        Entering the context returns once the watch is established, so a write made after
        that is guaranteed to be seen. The iterator yields non-empty batches of events in
        revision order.

        Cancelling the task that is entering or iterating always cancels it: the engine
        never swallows a cancel, whatever reply arrives with it. The store stops watches
        by cancelling their tasks (a leadership's guard, a campaign's wait), and whoever
        awaits such a task would otherwise wait for good.

        Raises (from the iterator or on entering):
            Compacted: ``start_revision`` is older than the retained history.
            StoreUnavailable: the stream broke; resume from the next undelivered revision.
        """

    @abstractmethod
    def watch_many(self) -> WatchMuxStream:
        """Open a multiplexed watch stream (see :class:`WatchMux`), closed with the context
        (every watch on it ends). Cancelling the task that iterates it always cancels it.

        Raises (on entering):
            StoreUnavailable: the engine could not be reached.
        """

    @abstractmethod
    async def current_revision(self) -> int:
        """The store's current revision."""

    @abstractmethod
    async def lease_grant(self, ttl_s: float) -> tuple[int, float]:
        """Create a lease; returns its id and the TTL the engine granted."""

    @abstractmethod
    async def lease_keepalive(self, lease_id: int) -> float:
        """Refresh a lease; returns the remaining TTL, or 0 when it has expired."""

    @abstractmethod
    async def lease_revoke(self, lease_id: int) -> None:
        """Revoke a lease now, deleting its keys. Revoking an unknown lease is a no-op."""

    @abstractmethod
    async def compact(self, revision: int) -> None:
        """Forget history before ``revision``: watches from older revisions fail."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections and timers. Open watches end with ``StoreClosed``."""
