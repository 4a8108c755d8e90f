"""Producer de-duplication: a resent (producer name, sequence id) is stored once.

The broker remembers, per producer name, the highest sequence id it has stored and the
positions of the most recent ones. A send whose id is not above that is a duplicate: it is
not stored again, and the producer gets the original message id when it is still known.
A send whose original is still being written waits for that write. A send above the highest
stored id but below one still being written (not its own) is refused, ServiceNotReady, and
not stored: written now, it would land after a later message of its producer (an
inversion); it is the resend of a send refused on a connection that was lost with its
answer, or a producer that does not number its sends in order (see
:meth:`~segtxn.broker.publishing.Publishing._admit`).

**Never stored is never a duplicate.** A send can be refused while later sends of its
producer are stored (one in a transaction that ended meanwhile, say); when the refusal is
lost with its connection, the producer sends it again, below the highest stored. Answered as
a duplicate (``-1:-1``, "where unknown", as Pulsar does), its producer took it for stored:
an application was told its message was durable when it was not. So a seq below the highest
stored that was not stored is refused again, whenever the broker can prove it: with the
refusal it got (the last ``RECENT_PER_PRODUCER`` refusals of each producer are remembered
while the topic stays loaded), else with one saying it was not stored
(``ProducerState.never_stored``). The proof is :attr:`ProducerState.known_from`: every
seq from there up that was stored is among the recent positions. A producer first seen
since the load is known from its first seq; as the recent positions forget the oldest, it
rises past them; after a recovery it is the first seq of the producer the replay reads
(the replay reads every entry after where it starts, and a producer's entries are in the
order of their seqs; for a producer it reads nothing of, the one after its highest stored).
Only a seq below that is answered ``-1:-1``: stored, or not, the broker does not know.

Each producer's state also holds its :class:`~segtxn.broker.ordering.SendOrder`: kept here,
with the rest of what the broker knows of a producer name, it outlives the producer's
connection, so a reconnected producer's sends are stored after its old connection's.

The state is snapshotted to ``/dedup/<quoted topic>`` every ``snapshot_every`` messages
(and when the topic closes); after a restart the snapshot is loaded and the entries written
after its ``position`` are replayed, so a producer reconnecting to a restarted broker is
de-duplicated too. **The replay reaches back one interval**: a snapshot's ``position`` is not
where it was taken but where the one before the last interval was (at least
``snapshot_every`` entries earlier), so a recovery learns again the positions of the last
``snapshot_every`` messages or more, not only of those written since the snapshot. Those are
the messages whose receipts may never have reached their producers (a broker that crashed,
or was fenced and hung up, right after storing them): their resends get their original
message ids. Before, a resend of a message stored just before a snapshot (a periodic one, or
the one a topic writes as it closes) got ``-1:-1``, "a duplicate, where unknown" (as
Pulsar answers), after any move of its segment: the producer could not tell where its
message was (found by the soak, seed 109003). A resend older than that still gets ``-1:-1``.
Nor does a snapshot vouch for any entry past that of a send not settled yet when it is
taken: the replay starts before it (:meth:`Deduplication.settled_up_to`).

**Expiry.** A producer name that stored nothing for ``expiry_s`` (a day by default, as
Kafka's ``producer.id.expiration.ms``; Pulsar forgets inactive producers after 6 hours) and
is not connected, with nothing in flight, is forgotten, at each snapshot and after a
recovery: otherwise every name that ever produced would stay in memory and in the
snapshot for good (clients make new names, e.g. each process start), and the snapshot
would outgrow what one store write takes. A producer that comes back under a forgotten
name after that starts afresh: a resend of a message older than the expiry is stored again.

**A name used again.** Each use of a name (from when the broker makes its state to when it
forgets it) has a number, higher than any given on the topic before (a counter kept in the
snapshot, ``last_use``, and raised by every entry a replay reads): its entries carry it
(``StoredMessage.producer_use``) and the snapshot holds each name's (``uses``). A replay
skips the entries of an earlier use than the name's state, and an entry of a later use
starts the name's state afresh there. A producer's entries are those of its own use, whatever
else the replay reads: before, a reload whose replay read the entries of a forgotten use as
well as the new one's (a replay from the first entry, or from a snapshot's position before
the new use began) took the old use's highest seq for the new producer's, and the new
producer's next sends (numbered from 0 again) were answered as duplicates, with an old
message's id or ``-1:-1``, and never stored. Entries written before uses were numbered
(use 0) count for whatever use the name's state has, as they always did.

**Larger than one store value**, a snapshot is written in parts; and only the topic's
owner writes it, fenced with its ledger (another broker may still believe it holds the topic
for a while): :mod:`segtxn.broker.dedup_snapshots` says how.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Container

from segtxn.broker.dedup_snapshots import DedupSnapshot, SnapshotStore, delete_state, record_key
from segtxn.broker.entry import decode_entry
from segtxn.broker.ordering import SendOrder
from segtxn.ledger import LedgerCorrupted, ManagedLedger, Position
from segtxn.ledger.errors import reworded
from segtxn.metastore import MetadataStore
from segtxn.protocol.errors import ServerError

log = logging.getLogger(__name__)

RECENT_PER_PRODUCER = 1024
DEFAULT_EXPIRY_S = 24 * 3600.0


def _now_ms() -> int:
    return int(time.time() * 1000)


class ProducerState:
    def __init__(self, last: int, seen_ms: int, use: int = 0) -> None:
        self.last = last
        self.use = use
        """Which use of its name this is (0: not numbered); its entries carry it, so a replay
        tells them from those of a use forgotten before (see the module docstring)."""
        self.seen_ms = seen_ms
        """When it last stored a message (or was first seen): what expiry goes by."""
        self.recent: OrderedDict[int, Position] = OrderedDict()
        """The positions of its last stored seqs (at most ``RECENT_PER_PRODUCER``)."""
        self.known_from = last + 1
        """Every seq from here up that was stored is in :attr:`recent` or in flight, so one
        from here up that is in neither was never stored (:meth:`never_stored`). It rises
        as :attr:`recent` forgets; after a recovery it is where the replay starts knowing
        this producer (see the module docstring)."""
        self.refusals: OrderedDict[int, ServerError] = OrderedDict()
        """The refusals of its last sends taken in and not stored (at most
        ``RECENT_PER_PRODUCER``, while the topic stays loaded): a resend gets the same."""
        self.in_flight: dict[int, asyncio.Future[Position]] = {}
        self.taken = last
        """The highest seq ever taken in (its write may have failed since): below it, a
        new send may be overtaken by one in flight (:meth:`overtaken_by`)."""
        self.order = SendOrder()
        """The turns of this producer's sends: they are stored in the order they arrive."""
        self.floors: dict[int, Position | None] = {}
        """For each send taken in and not settled yet (stored or refused), the ledger's
        last entry when it was: its own entry is after it, and may be durable already
        without being noted here (:meth:`Deduplication.settled_up_to`)."""

    def take_in(self, seq: int, original: asyncio.Future[Position], floor: Position | None) -> None:
        """A send of ``seq`` is to be written; its resends wait on ``original``. ``floor``:
        the ledger's last entry now (None: none); the send's entry will be after it."""
        self.in_flight[seq] = original
        self.floors[seq] = floor
        self.taken = max(self.taken, seq)

    def overtaken_by(self, seq: int) -> int | None:
        """The highest seq above ``seq`` still being written (None: none is). Costs a look
        at the sends in flight only when ``seq`` is below one taken in before: a resend, or
        a producer that does not number its sends in order."""
        if seq >= self.taken:
            return None
        return max((s for s in self.in_flight if s > seq), default=None)

    def stored(self, seq: int, position: Position, at_ms: int) -> None:
        self.last = max(self.last, seq)
        self.taken = max(self.taken, seq)
        self.seen_ms = max(self.seen_ms, at_ms)
        self.recent[seq] = position
        self.refusals.pop(seq, None)
        self.floors.pop(seq, None)
        while len(self.recent) > RECENT_PER_PRODUCER:
            forgotten, _ = self.recent.popitem(last=False)
            self.known_from = max(self.known_from, forgotten + 1)

    def refused(self, seq: int, refusal: ServerError) -> None:
        """A send of ``seq`` taken in was not stored: its resends get ``refusal`` again
        once a later seq is stored (before that, a resend is taken in afresh)."""
        self.refusals[seq] = refusal
        self.refusals.move_to_end(seq)
        self.floors.pop(seq, None)
        while len(self.refusals) > RECENT_PER_PRODUCER:
            self.refusals.popitem(last=False)

    def never_stored(self, seq: int) -> bool:
        """``seq``, not above :attr:`last` and not in flight, was provably never stored:
        refused, or never received. False: stored, or not known (where unknown)."""
        return seq in self.refusals or (seq >= self.known_from and seq not in self.recent)

    @property
    def last_taken(self) -> int:
        """The highest seq taken in, stored or still being written: where a producer that
        connects under this name goes on. Counting only stored ones, a producer restarted
        while its old connection's last send was still being written reused that seq, and
        its new message was answered as that send's duplicate and never stored."""
        return max(self.last, max(self.in_flight, default=self.last))

    @property
    def busy(self) -> bool:
        """A send of it is in flight or waiting for its turn."""
        return bool(self.in_flight) or not self.order.idle


class Deduplication:
    def __init__(
        self,
        topic: str,
        store: MetadataStore,
        snapshot_every: int,
        *,
        expiry_s: float = DEFAULT_EXPIRY_S,
    ) -> None:
        self._key = record_key(topic)
        self._snapshots = SnapshotStore(topic, store)
        self._every = snapshot_every
        self._expiry_ms = int(expiry_s * 1000)
        self.producers: dict[str, ProducerState] = {}
        self.connected: Container[str] = ()
        """The names of the producers connected now (never forgotten): the topic's."""
        self._since_snapshot = 0
        self._position: Position | None = None
        """The last entry stored (or replayed)."""
        self._marks: tuple[Position | None, Position | None] = (None, None)
        """Where the last two intervals ended (the older one is what a snapshot names as its
        ``position``, so the replay reaches back at least one interval)."""
        self._topic = topic
        self._store = store
        self._last_use = 0
        """The highest use of a name given on the topic, or read (snapshot, entries)."""

    def state(self, producer: str) -> ProducerState:
        """``producer``'s state, made if new (seen now): a new use of its name."""
        state = self.producers.get(producer)
        if state is None:
            self._last_use += 1
            state = self.producers[producer] = ProducerState(-1, _now_ms(), self._last_use)
        return state

    def expire(self, now_ms: int | None = None) -> int:
        """Forget the producers idle past the expiry (see the module docstring); returns
        how many were forgotten."""
        cutoff = (_now_ms() if now_ms is None else now_ms) - self._expiry_ms
        idle = [
            name
            for name, state in self.producers.items()
            if state.seen_ms < cutoff and not state.busy and name not in self.connected
        ]
        for name in idle:
            del self.producers[name]
        return len(idle)

    async def recover(self, ledger: ManagedLedger) -> None:
        """Load the snapshot and replay every entry written after it. ``ledger`` is the
        topic's, opened by this owner: it fences every later snapshot
        (:mod:`segtxn.broker.dedup_snapshots`).

        Raises:
            LedgerCorrupted: an entry after the snapshot's ``taken_at`` (or any, without
                one) cannot be read: what the snapshot lacks may be in it (a send settled
                after it was taken), so it is not skipped; the message says so, and names
                the file and the entry (damage before ``taken_at`` is skipped, logged).
        """
        start = ledger.first_position()
        taken: Position | None = None
        now = _now_ms()
        snapshot = await self._snapshots.load(ledger)
        if snapshot is not None:
            for name, last in snapshot.producers.items():
                use = snapshot.uses.get(name, 0)
                self.producers[name] = ProducerState(last, snapshot.seen.get(name, now), use)
            self._last_use = max(snapshot.last_use, *snapshot.uses.values(), 0)
            if snapshot.position is not None:
                replayed_from = Position(*snapshot.position)
                start = ledger.position_after(replayed_from)
                self._marks = (replayed_from, replayed_from)
            last_then = snapshot.taken_at or snapshot.position
            taken = None if last_then is None else Position(*last_then)
        reached: set[str] = set()  # the producers the replay read an entry of (since a skip)
        while start is not None:
            try:
                entries = await ledger.read(start, max_entries=1000, max_bytes=64 << 20)
            except LedgerCorrupted as e:
                if taken is None or start > taken:  # what the snapshot may lack: never skipped
                    held = (
                        "no snapshot holds what they stored"
                        if taken is None
                        else f"its snapshot holds what was stored up to {taken} only"
                    )
                    raise reworded(
                        e,
                        f"{self._topic}: de-duplication must replay the entries from {start} "
                        f"({held}) and cannot read them: {e}",
                    ) from e
                # only the look-back is unreadable: what the snapshot holds is enough, the
                # ids of the resends of what it skips are not known (-1:-1)
                log.warning(
                    "%s: de-duplication's look-back could not read from %s (%s); resends of "
                    "messages stored up to %s get no message id",
                    self._key,
                    start,
                    e,
                    taken,
                )
                start = ledger.position_after(taken)
                reached.clear()  # what it skips is not known: from each one's next entry
                for state in self.producers.values():
                    state.known_from = state.last + 1
                continue
            if not entries:
                break
            for entry in entries:
                message = decode_entry(entry.payload)
                if message.marker is not None:  # a v4 transaction marker: no producer's
                    continue
                name, at = message.producer_name, message.publish_time_ms
                first = name not in reached
                use = message.producer_use
                if self._replayed(
                    name, message.sequence_id, entry.position, at=at, use=use, first=first
                ):
                    reached.add(name)
            self._position = entries[-1].position
            start = ledger.position_after(entries[-1].position)
        self._marks = (self._marks[0], self._position)
        self.expire(now)

    def _replayed(
        self, producer: str, seq: int, position: Position, *, at: int, use: int, first: bool
    ) -> bool:
        """An entry the recovery read again, written by ``use`` of the name ``producer``
        (``first``: the first of the name's state it read). The replay reads every entry
        after where it starts, and a producer's entries are in the order of their seqs, so
        from the first seq of ``producer`` it reads, every stored seq is one it reads: its
        state knows them from there (:attr:`ProducerState.known_from`), whatever the
        snapshot said.

        An entry of a use before the state's belongs to a name forgotten since: skipped
        (False). One of a later use starts the state afresh: the name was forgotten and
        used again (the module docstring's "A name used again")."""
        self._last_use = max(self._last_use, use)
        state = self.producers.get(producer)
        if state is not None and use and use < state.use:
            return False
        if state is None or use > state.use:
            state = self.producers[producer] = ProducerState(-1, at, use)
            first = True
        if first:
            state.known_from = seq
        state.stored(seq, position, at)
        return True

    def note_stored(self, producer: str, seq: int, position: Position) -> bool:
        """Record a stored message; True when a snapshot is due."""
        self.state(producer).stored(seq, position, _now_ms())
        if self._position is None or position > self._position:
            self._position = position
        self._since_snapshot += 1
        return self._since_snapshot >= self._every

    async def snapshot(self) -> None:
        """Write the snapshot: the producers' state now, replayed from the end of the
        interval before the last (see the module docstring). After :meth:`recover`.

        Raises:
            SnapshotFenced: another owner opened the topic's ledger; it writes the snapshot.
            MetadataStoreError: the store failed (a recovery replays from an older one).
        """
        if self._since_snapshot >= self._every:  # an interval ended
            self._marks = (self._marks[1], self._position)
        self._since_snapshot = 0
        self.expire()
        at = self.settled_up_to(self._marks[0])
        position = None if at is None else (at.ledger_id, at.entry_id)
        last = self.settled_up_to(self._position)
        body = DedupSnapshot(
            position,
            {n: s.last for n, s in self.producers.items()},
            {n: s.seen_ms for n, s in self.producers.items()},
            None if last is None else (last.ledger_id, last.entry_id),
            uses={n: s.use for n, s in self.producers.items() if s.use},
            last_use=self._last_use,
        )
        await self._snapshots.write(body)

    def settled_up_to(self, position: Position | None) -> Position | None:
        """``position``, or the lowest floor of the sends not settled yet if lower (None:
        before the first entry). A send's entry is durable before it is noted here: a
        transactional one's is recorded in its transaction first (a store write), a plain
        batch's once all of the batch's writes are done; other producers' later entries
        are noted meanwhile. A snapshot holds every entry up to its ``position`` and
        ``taken_at`` only when they are bounded so: before, they were the last entries
        noted, a recovery after a crash did not read the entry of such a send (nor did one
        skipping an unreadable look-back), the snapshot did not have its seq either, and
        the resend of its message, its receipt lost with the broker, was stored again."""
        for state in self.producers.values():
            for floor in state.floors.values():
                if position is None or floor is None:
                    return None
                position = min(position, floor)
        return position

    async def delete(self) -> None:
        await delete_state(self._store, self._topic)
