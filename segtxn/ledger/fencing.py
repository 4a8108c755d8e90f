"""Compare-and-set writes of ledger and cursor metadata, with unknown outcomes resolved.

A CAS whose reply is lost (``StoreUnavailable``) may or may not have landed. Guessing
wrong either way is bad: assuming it failed makes the next CAS use a stale version and
report a fencing that never happened; assuming it succeeded may lose the change. So the
record is read back: our bytes at a new version mean it landed; anything but the old
version means another owner wrote it. The old version does not mean it did not land: on
etcd a write whose call failed may still be queued, and be applied after the read-back
(a rollover taken as failed would then close the ledger that appends went on into, at its
earlier count). So the record's own value is written back over it on that version, which
the late write can no longer match (``NotLanded``: now certain; the caller goes on from
the new version). This costs a write only after a failed one.

When the read-back is lost too, the outcome stays unknown (``OutcomeUnknown``: a rollover
stops the ledger's appends until it is reopened), and the writer's next CAS finds
the record a version ahead if it landed. So each writer (a cursor, a managed ledger) keeps
the values it tried since its last write known to land (:class:`TriedWrites`): a record
found holding one of them is its own write (:func:`own_landed_write`), taken up and built
on; any other value is another owner's, a fencing as ever. A door-closing write whose own
answer is lost may land too (the record as it was, at a later version): the writer adds
that value (``OutcomeUnknown.written_back``) to its tried values, so it is known again.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Sequence
from typing import cast

from segtxn.ledger.errors import LedgerFenced
from segtxn.metastore import (
    BadVersion,
    Check,
    MetadataStore,
    NotFound,
    Op,
    Put,
    Record,
    StoreUnavailable,
)

TRIED_WRITES_KEPT = 1024
"""How many values tried since its last write known to land a writer remembers (a 16-byte
digest each), to know its own write again when one landed with no answer to tell it (a
store outage): an older one is taken for another owner's change, as any other."""


class TriedWrites:
    """Digests of the values a writer tried since its last write known to land: any of
    them may have landed unseen. Cleared once a write is known to land (a CAS on the
    version every earlier try also needed, so none still in flight can land after it)."""

    def __init__(self) -> None:
        self._digests: deque[bytes] = deque(maxlen=TRIED_WRITES_KEPT)

    @staticmethod
    def _digest(value: bytes) -> bytes:
        return hashlib.blake2b(value, digest_size=16).digest()

    def add(self, value: bytes) -> None:
        self._digests.append(self._digest(value))

    def clear(self) -> None:
        self._digests.clear()

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __contains__(self, value: object) -> bool:
        return isinstance(value, bytes) and self._digest(value) in self._digests

    def failed(self, error: NotLanded | OutcomeUnknown) -> int | None:
        """Take in what a failed compare-and-set tells: after :class:`NotLanded` no state
        tried can land any more (forgotten), and the record's version to go on from is
        returned; after :class:`OutcomeUnknown` the door write's state, if there was one,
        may land too (remembered), and None is returned (the version is not known)."""
        if isinstance(error, NotLanded):
            self.clear()
            return error.version
        if error.written_back is not None:
            self.add(error.written_back)
        return None


async def own_landed_write(
    store: MetadataStore, key: str, version: int, tried: TriedWrites
) -> Record | None:
    """After a CAS expecting ``key`` at ``version`` found it changed: the record, if it
    holds a value in ``tried`` at a later version (the writer's own write landed, but its
    answer and the read-back that would tell were lost); None if the change is another
    writer's (or the record is gone).

    Raises:
        StoreUnavailable: the record could not be read (still unknown; the caller retries).
    """
    if not tried:
        return None
    found = await store.get(key)
    if found is None or found.version <= version or found.value not in tried:
        return None
    return found


class OutcomeUnknown(StoreUnavailable):
    """A compare-and-set whose answer was lost, and so was reading the record back (or
    closing the door on it): it may have landed or not. A writer whose state in memory
    depends on the answer (a rollover names the ledger appends go to) cannot go on until it
    knows.

    :attr:`written_back` is the record's own value when the write that closes the door
    (see :class:`NotLanded`) was the one whose answer was lost: it may land too, leaving the
    record as it was at a later version. The writer adds it to its :class:`TriedWrites`, so
    that its next CAS, finding it there, takes it for its own write, not another owner's."""

    def __init__(self, message: str, *, written_back: bytes | None = None) -> None:
        super().__init__(message)
        self.written_back = written_back


async def _read_back(store: MetadataStore, key: str) -> Record | None:
    try:
        return await store.get(key)
    except StoreUnavailable as e:
        raise OutcomeUnknown(f"{key}: a write may have landed or not ({e})") from e


class OwnerChanged(LedgerFenced):
    """The ledger's own metadata record moved on since the write was planned (its owner, or
    another one, changed it): see :func:`cas_put_owned`.

    Retriable: once it is known to be another owner's change (a cursor's save that escapes
    with it), the ledger is served where it is owned now, and the call made again (after a
    lookup) reaches it there; the broker lets go of it
    (:meth:`~segtxn.ledger.chain.LedgerChain.fenced`). Not retriable, it was answered as
    a bug (``UnknownError``) where nothing named it: an admin's reset that met it."""

    retriable = True


class OwnerUnknown(StoreUnavailable):
    """A write conditional on the ledger's metadata record (:func:`cas_put_owned`: a
    cursor's save) found the record moved on while a change of its owner's own was in
    doubt (its answer and read-back lost), and the record could not be read to tell
    whether that change or another owner's moved it. Nothing is fenced, and the write did
    not land: a later one, once the store answers, takes the owner's change up (or is
    fenced, if it was another owner's)."""


class NotLanded(StoreUnavailable):
    """A compare-and-set whose answer was lost, now certain never to land. The record was
    read back unchanged, but on etcd a write whose call failed may still be queued and
    applied later; so the record's own value was written back over it (a CAS on the same
    version), which the lost write, if it comes, fails to match. The record, unchanged,
    is now at :attr:`version`: the writer goes on from there."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


async def _close_the_door(
    store: MetadataStore, key: str, value: bytes, unchanged: Record, checks: Sequence[Op] = ()
) -> int:
    """After a CAS of ``value`` whose answer was lost found ``key`` still ``unchanged``:
    write the record's own value back on that version (with ``checks``), so that the lost
    write can never land; raise :class:`NotLanded`. If something landed first, return
    the version of ours, or raise ``LedgerFenced`` for another owner's (``OwnerChanged``
    when the ``checks`` failed and the record is still as found).

    Raises:
        NotLanded: the write did not land and never will.
        OutcomeUnknown: the store could not be reached again: the write may land or not,
            and so may the door write (its ``written_back``) if that was the one lost.
    """
    ops = [*checks, Put(key, unchanged.value, expected_version=unchanged.version)]
    try:
        written = cast(Record, (await store.commit(ops))[-1])
    except (BadVersion, NotFound) as e:
        current = await _read_back(store, key)
        if current is not None and current.value == value and current.version > unchanged.version:
            return current.version  # ours landed just before
        failed_key = getattr(e, "key", None)
        if current is not None and current.version == unchanged.version and failed_key != key:
            raise OwnerChanged(f"{failed_key}: changed since the write was planned") from e
        raise LedgerFenced(f"{key}: changed by another owner") from e
    except StoreUnavailable as e:
        raise OutcomeUnknown(
            f"{key}: a write may have landed or not ({e})", written_back=unchanged.value
        ) from e
    raise NotLanded(f"{key}: a write's answer was lost; it did not land", written.version)


async def cas_put(store: MetadataStore, key: str, value: bytes, expected_version: int) -> int:
    """Write ``value`` if ``key`` is still at ``expected_version``; return the new version.

    Raises:
        LedgerFenced: someone else changed the record.
        NotLanded: the store could not be reached; the write did not land and never will
            (the record, unchanged, is at a new version: see the class).
        OutcomeUnknown: the store cannot be reached, nor the record read back: the write
            may have landed or not (the caller must allow for both).
    """
    try:
        record = await store.put(key, value, expected_version=expected_version)
        return record.version
    except (BadVersion, NotFound) as e:
        raise LedgerFenced(f"{key}: changed by another owner") from e
    except StoreUnavailable:
        current = await _read_back(store, key)
        if current is not None and current.value == value and current.version > expected_version:
            return current.version
        if current is not None and current.version == expected_version:
            return await _close_the_door(store, key, value, current)
        raise LedgerFenced(f"{key}: changed by another owner") from None


async def cas_put_owned(
    store: MetadataStore,
    key: str,
    value: bytes,
    expected_version: int,
    *,
    owner_key: str,
    owner_version: int,
) -> int:
    """:func:`cas_put`, and only while the record at ``owner_key`` (the ledger's metadata) is
    still at ``owner_version``: a record of a ledger (a cursor) is fenced with the ledger.
    Another owner that recovered the ledger changed its metadata, so a replaced owner can no
    longer write — not even with the cursor version the new owner restored.

    Raises:
        OwnerChanged: the metadata record changed (the caller may check whether it was its
            own change, and try again with the new version).
        LedgerFenced: someone else changed the record.
        NotLanded: the store could not be reached; the write did not land and never will
            (the record, unchanged, is at a new version: see the class).
        OutcomeUnknown: the store cannot be reached, nor the record read back: the write
            may have landed or not (the caller must allow for both).
    """
    ops: list[Op] = [
        Check(owner_key, owner_version),
        Put(key, value, expected_version=expected_version),
    ]
    try:
        written = cast(Record, (await store.commit(ops))[1])  # (a Put's is its record)
        return written.version
    except (BadVersion, NotFound) as e:
        if getattr(e, "key", None) == owner_key:
            raise OwnerChanged(f"{owner_key}: changed since version {owner_version}") from e
        raise LedgerFenced(f"{key}: changed by another owner") from e
    except StoreUnavailable:
        current = await _read_back(store, key)
        if current is not None and current.value == value and current.version > expected_version:
            return current.version
        if current is not None and current.version == expected_version:
            owner = Check(owner_key, owner_version)
            return await _close_the_door(store, key, value, current, [owner])
        raise LedgerFenced(f"{key}: changed by another owner") from None
