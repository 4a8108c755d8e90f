"""Where a topic's de-duplication snapshot lives, and how its owner reads and writes it.

The snapshot (:class:`DedupSnapshot`, what :mod:`segtxn.broker.dedup` knows of each producer)
is the record ``/dedup/<quoted topic>``. **Larger than one store value** (the store's
``max_value_bytes``, 1 MiB, under etcd's 1.5 MiB request: about 2,400 names of the longest
length a client may use), it is written in parts: each at
``/dedup/<quoted topic>/<generation>/<n>``, all of them before the record, which names
their generation and count and holds the rest (``position``, ``taken_at``, ``last_use``);
the parts the record no longer names are deleted after it. So a crash at any step leaves the record
naming complete parts (the new ones or the old), plus at most some unnamed parts, deleted
by the next snapshot. Before, such a snapshot was refused at every attempt: a reload
replayed from the last one that fit, or from the first entry retention left, and forgot
every producer whose messages were trimmed (their resends were stored again). No producer
is dropped to make it fit: exactly-once holds for every name within the expiry, whatever
their number.

**Only the topic's owner writes, and each write is fenced with the topic's ledger.** Two
brokers may hold the same topic for a while: the old owner not knowing yet that it lost it
(paused, or its session expired) and the new one, after a take-over. So every write here,
each part, the record and each deletion of a part, is one atomic step with a check that the
ledger's metadata record is still at the version its owner last wrote
(:func:`~segtxn.ledger.fencing.cas_put_owned`'s condition, as a cursor's save). The new
owner's open changed it (and a topic deleted and made again under its name has another
record), so from then on the old owner writes and deletes nothing; the new owner reads the
record and its parts (:meth:`SnapshotStore.load`) only after that open. A check that fails
on a change of the owner's own (a roll-over meanwhile) is tried again on the new version;
another owner's change raises :class:`SnapshotFenced`, and stops the ledger first (its owner
lets the topic go: :mod:`segtxn.ledger.ownership`). Telling them apart may need a read
of the record (the owner's own last change landed with its answer lost); while that cannot
be settled it is :class:`SnapshotOwnerUnknown`, not a fence (the check shared with a
cursor's save and an op-record step: :mod:`segtxn.ledger.ownership`): before, it was taken
for one, logged as a take-over that never happened, and a closing snapshot was skipped for
one failed read. Under that check no other broker's
write meets this owner's, and a write of its own whose answer was lost cannot land later
over a newer one (the store applies each write only on the revisions it read). So the
parts a record names are deleted only once a record that does not name them has landed,
by the owner that wrote it.

Before, these writes were unconditional, and the clean-up deleted every part but those of
its own generation. The old owner's last snapshot, as it let go of the topic, replaced the
new owner's record with what it knew (the new owner's producers not in it); or its record,
held up while the new owner wrote its own, landed after and named parts the new owner's had
deleted; or its clean-up deleted the new owner's parts. A reload replayed what it could, and
once the ledger was trimmed it forgot those producers: their resends were stored again. And
an old owner's last snapshot of a topic deleted and made again meanwhile became the new
topic's: its producers' first sends were answered as duplicates, never stored
(tests/broker/test_dedup_two_owners.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from urllib.parse import quote

import msgspec

from segtxn.ledger import ManagedLedger
from segtxn.ledger.fencing import OwnerUnknown
from segtxn.ledger.metadata import metadata_key
from segtxn.ledger.ownership import changed_by_its_owner
from segtxn.metastore import (
    BadVersion,
    Check,
    Delete,
    MetadataStore,
    MetadataStoreError,
    NotFound,
    Op,
    Put,
)

log = logging.getLogger(__name__)

PREFIX = "/dedup/"
DELETES_PER_STEP = 100
"""Parts deleted in one atomic step (with the ownership check: under the store's 128)."""


class SnapshotFenced(Exception):
    """The snapshot was not written (or older parts not deleted): the topic's ledger was
    opened by another owner since this one last changed it. The other owner writes it."""


class SnapshotOwnerUnknown(OwnerUnknown):
    """The snapshot was not written (or older parts not deleted): its ownership check met a
    change of the ledger's metadata record, this owner's own (its answer lost) or another
    owner's, and that could not be told (:func:`~segtxn.ledger.ownership.changed_by_its_owner`:
    the store failed the read, or the ledger must be reopened). Nothing is fenced: the next
    snapshot, once the store answers, is written as usual (a reload replays meanwhile)."""


class DedupSnapshot(msgspec.Struct, frozen=True):
    position: tuple[int, int] | None
    """A recovery replays the entries after here (None: all). Every entry up to here is
    reflected in ``producers`` (bounded as ``taken_at`` is), and usually more (replaying
    one again changes nothing): it lags one interval behind (see :mod:`segtxn.broker.dedup`)."""
    producers: dict[str, int]
    """producer name -> highest stored sequence id."""
    seen: dict[str, int] = msgspec.field(default_factory=dict)
    """producer name -> when it last stored a message (ms; absent in older snapshots)."""
    taken_at: tuple[int, int] | None = None
    """The last entry stored when it was taken, or the entry before the first one of a
    send not settled yet (:meth:`segtxn.broker.dedup.Deduplication.settled_up_to`):
    ``producers`` reflects every entry up to here, so the replay before it only learns
    positions again (None: an older snapshot, taken at ``position``; or none stored)."""
    generation: str = ""
    """The generation of the parts holding more producers ("": none, all are here)."""
    parts: int = 0
    """How many parts (see the module docstring)."""
    uses: dict[str, int] = msgspec.field(default_factory=dict)
    """producer name -> which use of the name it is (absent: 0, not numbered; see
    :mod:`segtxn.broker.dedup`, "A name used again")."""
    last_use: int = 0
    """The highest use given on the topic (the next name's is above it)."""


class DedupPart(msgspec.Struct, frozen=True):
    """Some producers of a snapshot too large for one store value."""

    producers: dict[str, int]
    seen: dict[str, int]
    uses: dict[str, int] = msgspec.field(default_factory=dict)


def record_key(topic: str) -> str:
    """The key of ``topic``'s snapshot record."""
    return PREFIX + quote(topic, safe="")


def parts_prefix(topic: str) -> str:
    """Where the parts of ``topic``'s snapshots are."""
    return record_key(topic) + "/"


async def delete_state(store: MetadataStore, topic: str) -> None:
    """Delete ``topic``'s de-duplication snapshot and its parts (idempotent)."""
    key = record_key(topic)
    await store.delete_range(key, key + "\x01")
    await store.delete_range(parts_prefix(topic))


_encode = msgspec.json.Encoder().encode


def _split(snapshot: DedupSnapshot, limit: int) -> list[DedupPart]:
    """The producers of ``snapshot`` in parts of at most ``limit`` bytes each, encoded."""
    parts: list[DedupPart] = []
    size = limit
    for name, last in snapshot.producers.items():
        # a name (escaped) thrice, an i64 seq, a ms time, an i64 use, three colons and commas
        need = 3 * len(_encode(name)) + 3 * 20 + 6
        if size + need > limit:
            parts.append(DedupPart({}, {}, {}))
            size = len(_encode(parts[-1]))
        parts[-1].producers[name] = last
        parts[-1].seen[name] = snapshot.seen[name]
        if name in snapshot.uses:
            parts[-1].uses[name] = snapshot.uses[name]
        size += need
    return parts


class SnapshotStore:
    """One owner's reads and writes of one topic's snapshot (the module docstring says
    how they are fenced). :meth:`load` first: it names the owner's ledger."""

    def __init__(self, topic: str, store: MetadataStore) -> None:
        self._key = record_key(topic)
        self._prefix = parts_prefix(topic)
        self._store = store
        self._ledger: ManagedLedger | None = None
        self._generation = ""
        """The generation of the parts the record last read or written names."""

    async def load(self, ledger: ManagedLedger) -> DedupSnapshot | None:
        """The snapshot, with the producers of its parts (None: there is none, or a part is
        missing, logged: the caller replays the whole ledger). ``ledger``, opened by this
        owner before, fences every later write."""
        self._ledger = ledger
        record = await self._store.get(self._key)
        if record is None:
            return None
        snapshot = msgspec.json.decode(record.value, type=DedupSnapshot)
        self._generation = snapshot.generation
        for n in range(snapshot.parts):
            part_record = await self._store.get(self._part_key(snapshot.generation, n))
            if part_record is None:
                log.error("%s: part %d of its snapshot is missing; replaying", self._key, n)
                return None
            part = msgspec.json.decode(part_record.value, type=DedupPart)
            snapshot.producers.update(part.producers)
            snapshot.seen.update(part.seen)
            snapshot.uses.update(part.uses)
        return snapshot

    async def write(self, body: DedupSnapshot) -> None:
        """Write ``body``, in parts if it does not fit in one store value (the order the
        module docstring says: parts, then the record, then the parts it no longer names).

        Raises:
            SnapshotFenced: another owner opened the ledger; nothing was written since.
            MetadataStoreError: the store failed (the record is the last one that landed).
        """
        encoded = _encode(body)
        limit = self._store.settings.max_value_bytes
        generation = ""
        if len(encoded) > limit:
            # ordered after the last one (time, unless a clock is behind), and unique
            counter = max(time.time_ns(), int(self._generation.split("-")[0] or 0) + 1)
            generation = f"{counter:020d}-{uuid.uuid4().hex[:8]}"
            parts = _split(body, limit)
            for n, part in enumerate(parts):
                key = self._part_key(generation, n)
                await self._owned([Put(key, _encode(part))])
            body = msgspec.structs.replace(
                body, producers={}, seen={}, uses={}, generation=generation, parts=len(parts)
            )
            encoded = _encode(body)
        await self._owned([Put(self._key, encoded)])
        self._generation = generation
        try:
            await self._clean_up()
        except (SnapshotFenced, MetadataStoreError) as e:
            log.warning("%s: parts it no longer names are left (%s): deleted later", self._key, e)

    async def _clean_up(self) -> None:
        """Delete the parts the record no longer names: those of other generations (older
        snapshots', and leftovers of failed ones), never reading the named ones."""
        end = self._prefix[:-1] + chr(ord(self._prefix[-1]) + 1)
        ranges = [(self._prefix, end)]
        if self._generation:
            named = self._prefix + self._generation + "/"
            ranges = [(self._prefix, named), (named[:-1] + chr(ord("/") + 1), end)]
        for lo, hi in ranges:
            while True:
                listing = await self._store.list_range(lo, hi, limit=DELETES_PER_STEP)
                if not listing.records:
                    break
                await self._owned([Delete(r.key, r.version) for r in listing.records])
                if not listing.more:
                    break

    async def _owned(self, ops: Sequence[Op]) -> None:
        """Commit ``ops`` while the ledger's metadata record is at the version its owner
        (this process) last wrote; after a change of its own meanwhile, it is tried again
        on the new version.

        Raises:
            SnapshotFenced: the record changed under another owner.
            SnapshotOwnerUnknown: it changed, and the store could not be read to tell whose
                change it was.
        """
        ledger = self._ledger
        if ledger is None:
            raise RuntimeError(f"{self._key}: a snapshot is written by the owner that loaded it")
        owner_key = metadata_key(ledger.name)
        while True:
            version = ledger.metadata_version
            try:
                await self._store.commit([Check(owner_key, version), *ops])
                return
            except (BadVersion, NotFound) as e:
                if e.key != owner_key:
                    raise
                try:
                    own = await changed_by_its_owner(ledger, version)
                except OwnerUnknown as unknown:
                    raise SnapshotOwnerUnknown(
                        f"{self._key}: not written: {unknown}: a later snapshot is written as usual"
                    ) from unknown.__cause__
                if not own:
                    raise SnapshotFenced(
                        f"{self._key}: {ledger.name} was opened by another owner (this one "
                        "writes nothing more of the snapshot)"
                    ) from e

    def _part_key(self, generation: str, n: int) -> str:
        return f"{self._prefix}{generation}/{n:06d}"
