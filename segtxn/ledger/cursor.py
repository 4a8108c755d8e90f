"""Durable cursors: where a subscription is in a managed ledger.

A cursor is a *mark-delete position* (every entry at or before it is acknowledged) plus the
set of entries acknowledged individually beyond it (a :class:`RangeSet`). Acknowledging the
entry right after the mark-delete position moves the mark forward across every range it
then touches.

State is stored at ``/managed-cursors/<quoted ledger>/<quoted cursor>`` (JSON), written with
compare-and-set. Writes are coalesced: while one is in flight, further changes wait and are
saved together by the next, so a burst of acknowledgments costs a few store writes, and
``ack`` returns only once its change is durable (unless asked not to wait: then the next
save carries it). At most ``max_persisted_ranges`` ranges are
stored; acknowledgments beyond them are lost on restart (those entries are delivered
again: duplicates, never loss). :meth:`ManagedCursor.saved` tells whether the last save
holds a position's acknowledgment, for those that must not be lost (a committed
transaction's, whose records stay until a save holds them).

A cursor never reads entries; dispatchers do, and tell the cursor what was acknowledged.
It sees its ledger only as a :class:`~segtxn.ledger.chain.LedgerChain` (positions).
It works the same on a sealed ledger (PIP-471: a sealed segment still moves its cursors).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from urllib.parse import quote, unquote

import msgspec

from segtxn.ledger.chain import LedgerChain
from segtxn.ledger.errors import CursorDamaged, CursorOverwritten, LedgerClosed, LedgerFenced
from segtxn.ledger.fencing import (
    NotLanded,
    OutcomeUnknown,
    OwnerChanged,
    OwnerUnknown,
    TriedWrites,
    cas_put_owned,
    own_landed_write,
)
from segtxn.ledger.metadata import metadata_key
from segtxn.ledger.ownership import changed_by_its_owner
from segtxn.ledger.position import Position
from segtxn.ledger.rangeset import RangeSet
from segtxn.metastore import (
    MUST_NOT_EXIST,
    AlreadyExists,
    MetadataStore,
    Record,
)

CURSORS_PREFIX = "/managed-cursors/"


class CursorState(msgspec.Struct, frozen=True):
    mark_delete: tuple[int, int]
    acked: list[list[int]] = msgspec.field(default_factory=list)
    """Individually acknowledged ranges beyond the mark: [ledger, first, ledger, last]."""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(CursorState).decode


def read_state(ledger: str, cursor: str, record: Record) -> CursorState:
    """The state of the ledger ``ledger``'s cursor ``cursor`` in its ``record``.

    Raises:
        CursorDamaged: it does not read (naming the cursor and the key): a bare decode
            error named neither, and an acknowledged range of other than four numbers
            failed later, as an unpacking error.
    """
    try:
        state = _decode(record.value)
    except msgspec.DecodeError as e:
        raise CursorDamaged(ledger, cursor, record.key, str(e)) from e
    for acked in state.acked:
        if len(acked) != 4:
            reason = f"an acknowledged range of {len(acked)} numbers, not 4"
            raise CursorDamaged(ledger, cursor, record.key, reason)
    return state


def cursors_prefix(ledger_name: str) -> str:
    return f"{CURSORS_PREFIX}{quote(ledger_name, safe='')}/"


def cursor_key(ledger_name: str, cursor_name: str) -> str:
    return cursors_prefix(ledger_name) + quote(cursor_name, safe="")


class ManagedCursor:
    """Create through :meth:`ManagedLedger.open_cursor`."""

    def __init__(
        self,
        *,
        ledger: LedgerChain,
        name: str,
        store: MetadataStore,
        state: CursorState,
        version: int,
        max_persisted_ranges: int,
    ) -> None:
        self.ledger = ledger
        self.name = name
        self._store = store
        self._key = cursor_key(ledger.name, name)
        self._mark = Position(*state.mark_delete)
        self._acked = RangeSet.from_list(state.acked)
        self._version = version
        self._max_ranges = max_persisted_ranges
        self._changes = 0  # generation of the in-memory state
        self._saved = 0  # generation last made durable
        self._saving: asyncio.Task[None] | None = None
        self._closed = False
        self._saved_through: Position | None = None
        """The last position whose acknowledgment the last save holds when that save left
        out ranges past ``max_persisted_ranges`` (None: it left out none)."""
        self._persisted_mark = self._mark
        """The lowest mark the store may hold: the last save's, or a lower one that a save
        tried since (failed, or in flight) may have written."""
        self._tried = TriedWrites()
        """The states tried since the last completed save: any may have landed."""

    # ================================================================= state

    @property
    def mark_delete(self) -> Position:
        """Every entry at or before this position is acknowledged."""
        return self._mark

    @property
    def acked_ranges(self) -> RangeSet:
        """Entries acknowledged individually beyond the mark (a copy)."""
        return RangeSet(list(self._acked))

    @property
    def persisted_mark_delete(self) -> Position:
        """The lowest mark-delete position the store may hold for this cursor: the last
        completed save's, or a lower one if a save tried since may have landed (a save that
        failed may have landed: its answer, and reading the record back, can both be lost;
        or it is still in flight). A restart restores the cursor from the store, so an
        acknowledgment that moved only :attr:`mark_delete` does not survive a crash:
        retention keeps every entry after this position too (:meth:`ManagedLedger.trim`)."""
        return self._persisted_mark

    def is_acked(self, position: Position) -> bool:
        return position <= self._mark or position in self._acked

    def saved(self, position: Position) -> bool:
        """Whether the last completed save holds the acknowledgment of ``position`` (made
        before it): false only past the ``max_persisted_ranges`` ranges it could hold."""
        return self._saved_through is None or position <= self._saved_through

    def backlog(self) -> int:
        """Entries after the mark that are not acknowledged."""
        return max(0, self.ledger.count_after(self._mark) - self._acked.count())

    # ================================================================= acknowledgment

    async def ack(self, positions: list[Position], *, wait: bool = True) -> None:
        """Acknowledge individual entries; returns once that is durable.

        ``wait=False`` applies them now and returns at once: the next save (a
        :meth:`flush`, or another change's) makes them durable. A caller that must not lose
        them in a crash keeps what it needs to apply them again until its flush returns.
        """
        for position in positions:
            if position > self._mark:
                self._acked.add(position)
        self._advance()
        await self._changed(wait)

    async def ack_cumulative(self, position: Position, *, wait: bool = True) -> None:
        """Acknowledge every entry up to and including ``position`` (``wait``: as
        :meth:`ack`)."""
        if position > self._mark:
            self._mark = position
            self._acked.remove_up_to(position)
        self._advance()
        await self._changed(wait)

    async def seek(self, position: Position) -> None:
        """Make ``position`` the next unacknowledged entry (forgets individual acks)."""
        self._mark = Position(position.ledger_id, position.entry_id - 1)
        self._acked = RangeSet()
        await self._changed()

    async def reset_to_earliest(self) -> None:
        first = self.ledger.first_position() or self.ledger.next_write_position()
        await self.seek(first)

    async def reset_to_latest(self) -> None:
        await self.seek(self.ledger.next_write_position())

    def _advance(self) -> None:
        """Move the mark across the acknowledged ranges that follow it. A range that
        starts before the next retained entry follows it too: the entries in between are
        gone (trimmed; a store written before trims kept what saved cursors need holds
        such states), and a mark waiting for them would wait for ever."""
        while True:
            first = self._acked.first()
            if first is None:
                return
            following = self.ledger.position_after(self._mark)
            if following is None or first[0] > following:
                return
            self._mark = first[1]
            self._acked.remove_up_to(first[1])

    # ================================================================= persistence

    async def _changed(self, wait: bool = True) -> None:
        if self._closed:
            raise LedgerClosed(f"cursor {self.name} is closed")
        self._changes += 1
        if wait:
            await self.flush()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` completed: the cursor takes no more changes."""
        return self._closed

    @property
    def durable(self) -> bool:
        """Whether the state in memory is the state saved (no change unsaved or saving)."""
        return self._saved == self._changes and self._saving is None

    async def flush(self) -> None:
        """Wait until the current state is durable (coalescing with writes in flight).

        Raises:
            OwnerChanged: another owner opened the ledger (its metadata record changed
                under a save, not by this owner); the ledger was told, and stopped taking
                appends (:meth:`_fenced`). Every later save is refused so too.
            CursorOverwritten: the cursor's own record was written by someone else (a
                repair, a hand edit) and reads; the ledger was told, and stopped taking
                appends (:meth:`_overwritten`), so that it is opened again to read it.
            CursorDamaged: the cursor's own record was written by someone else and does
                not read: an operator must repair it (nothing else is stopped).
            MetadataStoreError: the store failed (``OwnerUnknown``, ``NotLanded``,
                ``OutcomeUnknown`` among them); nothing is fenced: a later save carries the
                change.
        """
        target = self._changes
        while self._saved < target:
            if self._saving is None:
                self._saving = asyncio.create_task(
                    self._save(), name=f"cursor-save-{self.ledger.name}-{self.name}"
                )
            saving = self._saving
            await asyncio.shield(saving)

    async def _save(self) -> None:
        generation = self._changes
        ranges = self._acked.to_list(self._max_ranges)
        mark = self._mark
        state = CursorState((mark.ledger_id, mark.entry_id), ranges)
        self._persisted_mark = min(self._persisted_mark, mark)  # may land, whatever it says
        through = None
        if len(self._acked) > len(ranges):  # ranges left out: only what comes before counts
            through = Position(*ranges[-1][2:]) if ranges else self._mark
        encoded = _encode(state)
        self._tried.add(encoded)
        try:
            while True:
                owner_version = self.ledger.metadata_version
                try:
                    self._version = await cas_put_owned(
                        self._store,
                        self._key,
                        encoded,
                        self._version,
                        owner_key=metadata_key(self.ledger.name),
                        owner_version=owner_version,
                    )
                    break
                except OwnerChanged as e:
                    if not await self._changed_by_its_owner(owner_version):
                        raise self._fenced(e) from e
                except LedgerFenced as e:
                    if not await self._took_up_own_write():
                        raise await self._overwritten() from e
                except (NotLanded, OutcomeUnknown) as e:
                    if (version_now := self._tried.failed(e)) is not None:
                        self._version = version_now
                    raise
        finally:
            self._saving = None
        self._tried.clear()
        self._saved = generation
        self._saved_through = through
        # the store holds this save's state: a save is a compare-and-set on the version an
        # earlier attempt would also need, so none still in flight can land after it
        self._persisted_mark = mark

    async def _changed_by_its_owner(self, owner_version: int) -> bool:
        """After a save found the ledger's metadata record no longer at ``owner_version``:
        whether the ledger's own change moved it (the save goes again on the new version);
        False, proof that another owner did (the save is fenced).

        Raises:
            OwnerUnknown: the ledger's own change in doubt could not be settled (the store
                failed the read, even read again, or the ledger must be reopened): the save
                is refused as the store's trouble, to be tried again. It was taken for a
                fence ("another owner has the ledger") on a read that failed.
        """
        try:
            return await changed_by_its_owner(self.ledger, owner_version)
        except OwnerUnknown as e:
            raise OwnerUnknown(
                f"cursor {self.name} of {self.ledger.name}: not saved: {e}: a later save goes on"
            ) from e.__cause__

    def _fenced(self, changed: OwnerChanged) -> OwnerChanged:
        """The refusal of a save that met another owner's change of the ledger's metadata
        record (``changed``). The ledger was told when that was proved
        (:func:`~segtxn.ledger.ownership.changed_by_its_owner`): it stops taking appends
        and its owner lets it go, once, however many saves are refused so."""
        return OwnerChanged(
            f"cursor {self.name} of {self.ledger.name}: not saved: another owner opened the "
            f"ledger ({changed})"
        )

    async def _overwritten(self) -> CursorOverwritten | CursorDamaged:
        """The refusal of a save that found the cursor's own record written by someone
        else (not a write of its own that landed unseen), as the record is now:
        :class:`CursorDamaged` if it does not read (named with its repair; the ledger goes
        on: the repair, through its broker, unloads it first), else
        :class:`CursorOverwritten`, told to the ledger first so that it is opened again
        and the cursor read from the record. Either way every later save would be refused
        so: left a bare ``LedgerFenced``, the broker answered each ack as a bug.

        Raises:
            MetadataStoreError: the record could not be read; nothing is told (the next
                save meets the same refusal, and asks again).
        """
        record = await self._store.get(self._key)
        if record is not None:
            try:
                read_state(self.ledger.name, self.name, record)
            except CursorDamaged as damaged:
                return damaged
        overwritten = CursorOverwritten(
            f"cursor {self.name} of {self.ledger.name}: not saved: its record at {self._key} "
            f"was {'deleted' if record is None else 'written'} by someone else since this "
            "broker last saved it (a repair, a hand edit): the ledger is opened again to "
            "read it"
        )
        self.ledger.fenced(overwritten)
        return overwritten

    async def _took_up_own_write(self) -> bool:
        """After a save found the record changed: whether the record holds a state this
        cursor tried since its last completed save (it landed, but its answer and the
        read-back that would tell were lost). Then its version is taken up and the save is
        tried again, still conditional on the ledger's metadata record: another owner is
        fenced as ever. Otherwise the change is another owner's, and the save fails."""
        found = await own_landed_write(self._store, self._key, self._version, self._tried)
        if found is None:
            return False
        self._version = found.version
        return True

    async def close(self) -> None:
        """Make the state durable and stop. Idempotent."""
        if not self._closed:
            await self.flush()
            self._closed = True

    # ================================================================= creation

    @classmethod
    async def create(
        cls,
        *,
        ledger: LedgerChain,
        name: str,
        store: MetadataStore,
        mark_delete: Position,
        max_persisted_ranges: int,
    ) -> ManagedCursor:
        """A new cursor at ``mark_delete``, or the one the store already holds: a create
        whose answer was lost (the store restarted under it) landed all the same, and the
        retry must take that cursor rather than fail on it for good.

        Raises:
            CursorDamaged: the record found (created before) does not read.
            MetadataStoreError: the store failed (the cursor may have been created or not:
                creating it again takes it either way).
        """
        state = CursorState((mark_delete.ledger_id, mark_delete.entry_id))
        key = cursor_key(ledger.name, name)
        try:
            record = await store.put(key, _encode(state), expected_version=MUST_NOT_EXIST)
        except AlreadyExists:
            found = await store.get(key)
            if found is None:  # deleted again meanwhile: the caller may try once more
                raise
            state, record = read_state(ledger.name, name, found), found
        return cls(
            ledger=ledger,
            name=name,
            store=store,
            state=state,
            version=record.version,
            max_persisted_ranges=max_persisted_ranges,
        )

    @classmethod
    def restore(
        cls,
        *,
        ledger: LedgerChain,
        name: str,
        store: MetadataStore,
        record: Record,
        max_persisted_ranges: int,
    ) -> ManagedCursor:
        """The cursor ``name`` from its ``record``.

        Raises:
            CursorDamaged: the record does not read.
        """
        return cls(
            ledger=ledger,
            name=name,
            store=store,
            state=read_state(ledger.name, name, record),
            version=record.version,
            max_persisted_ranges=max_persisted_ranges,
        )


def restore_cursors(
    ledger: LedgerChain,
    store: MetadataStore,
    records: Sequence[Record],
    *,
    max_persisted_ranges: int,
) -> dict[str, ManagedCursor]:
    """The cursors of ``ledger`` from their records (a listing of
    :func:`cursors_prefix`), by name.

    Raises:
        CursorDamaged: a record does not read.
    """
    return {
        (name := unquote(record.key.rsplit("/", 1)[1])): ManagedCursor.restore(
            ledger=ledger,
            name=name,
            store=store,
            record=record,
            max_persisted_ranges=max_persisted_ranges,
        )
        for record in records
    }


class CursorTurns:
    """One :meth:`ManagedLedger.open_cursor` or :meth:`ManagedLedger.delete_cursor` of a
    cursor name at a time, in call order (other names are not held up). Each takes several
    store calls; interleaved, an open could take up the record a delete then removed, and
    list a cursor that a restart would not restore. A name's lock is dropped once no
    operation holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def users(self, name: str) -> int:
        """How many operations on ``name`` hold its turn or wait for it."""
        return self._locks.get(name, (None, 0))[1]

    @contextlib.asynccontextmanager
    async def turn(self, name: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(name) or (asyncio.Lock(), 0)
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)
