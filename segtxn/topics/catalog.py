"""The catalog of topics, brokers and placements in the metadata store.

Keys (all JSON):

- ``/topics/<domain>/<tenant>/<namespace>/<name>``: a topic record (``model.TopicRecord``);
- ``/homes/<quoted ledger name>``: which broker holds the managed ledger of a
  ``persistent://`` topic or a ``segment://`` (indexed by broker, ``homes-by-broker``);
- ``/brokers/<broker id>``: a live broker's advertised URL (ephemeral: its session; created,
  never overwritten by another session: :mod:`segtxn.broker.registration`).

A managed ledger lives on its home broker's disk, so a topic or segment is *placed* once,
when it is created, on the live broker with the fewest homes, and stays there: the home
broker is its owner. While the home broker is down its topics are unavailable
(``ServiceNotReady``); they come back when it restarts with the same id and disk.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

import msgspec

from segtxn.metastore import (
    MUST_NOT_EXIST,
    AlreadyExists,
    BadVersion,
    Check,
    Delete,
    MetadataStore,
    NotFound,
    Put,
    Record,
    Session,
)
from segtxn.protocol.names import Domain, TopicName
from segtxn.protocol.preconditions import PropertyPrecondition
from segtxn.topics import dag
from segtxn.topics.model import (
    PersistentTopic,
    ScalableTopic,
    TopicRecord,
    encode_topic,
    new_scalable_topic,
    read_topic,
)

log = logging.getLogger(__name__)

TOPICS = "/topics/"
HOMES = "/homes/"
BROKERS = "/brokers/"
HOMES_BY_BROKER = "homes-by-broker"
HOMES_PER_STEP = 40  # a home is a record and an index entry (and the old entry it replaces)


class BrokerInfo(msgspec.Struct, frozen=True):
    broker_id: str
    url: str
    started_ms: int
    instance: str = ""
    """Its storage node's instance (segtxn/ledger/replicas/node.py); empty: it keeps no
    replicas (replication is off)."""
    draining: bool = False
    """It is handing its topics to others: new ones are not placed on it."""
    session_ttl_s: float = 0.0
    """The TTL of the session holding the record: how long the record can outlive its
    broker's crash (0: not recorded, by an older version)."""


class TopicExists(Exception):
    pass


class PreconditionFailed(Exception):
    """A topic's record does not satisfy the precondition of a change: nothing was changed
    (the message says what the record holds)."""


@dataclass(frozen=True)
class DeletionMark:
    """A scalable topic marked ``deleting`` (:meth:`Catalog.mark_deleting`): its record as
    marked, and which topic of that name it is: the store revision that created the record
    (a topic deleted and created again under the name has another)."""

    topic: ScalableTopic
    created_version: int


class NoBrokers(Exception):
    pass


def broker_key(broker_id: str) -> str:
    return BROKERS + quote(broker_id, safe="")


def topic_key(name: TopicName) -> str:
    if name.domain is Domain.SEGMENT:
        raise ValueError("segments are part of their scalable topic's record")
    return TOPICS + name.path


def home_key(ledger_name: TopicName) -> str:
    return HOMES + quote(str(ledger_name), safe="")


def _placements(record: TopicRecord, homes: Sequence[tuple[TopicName, str]]) -> str:
    """``segment://t/ns/n/0 [0x0000-0x7fff] on broker b1, ...`` (at most 32 named)."""
    ranges = (
        {s.id: f" [{s.lo:#06x}-{s.hi:#06x}]" for s in record.segments}
        if isinstance(record, ScalableTopic)
        else {}
    )
    parts = [
        f"{ledger}{ranges.get(ledger.segment or 0, '')} on broker {home}"
        for ledger, home in homes[:32]
    ]
    more = f", ... (+{len(homes) - 32} more)" if len(homes) > 32 else ""
    return ", ".join(parts) + more


class Catalog:
    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    # ------------------------------------------------------------------ brokers

    async def register_broker(
        self,
        broker_id: str,
        url: str,
        session: Session,
        *,
        instance: str = "",
        draining: bool = False,
        expected_version: int = MUST_NOT_EXIST,
    ) -> Record:
        """Write ``/brokers/<broker_id>`` on ``session``: create it (the default), or
        rewrite the version this broker holds. Never an unconditional write: two processes
        must not both believe they are ``broker_id``.

        Raises:
            AlreadyExists: creating, and the id is registered (by a live session or one
                whose TTL has not run out yet).
            BadVersion, NotFound: rewriting, and the record changed or went.
            SessionExpired: ``session`` has expired.
        """
        info = BrokerInfo(
            broker_id, url, int(time.time() * 1000), instance, draining, session.ttl_s
        )
        return await self.store.put(
            broker_key(broker_id),
            msgspec.json.encode(info),
            expected_version=expected_version,
            session=session,
        )

    async def broker_record(self, broker_id: str) -> tuple[Record | None, BrokerInfo | None, int]:
        """``broker_id``'s registration record, decoded (None if it is not a broker's),
        and the revision it was read at (watch from the next one to follow it)."""
        record, revision = await self.store.get_at(broker_key(broker_id))
        info = None
        if record is not None:
            with contextlib.suppress(msgspec.DecodeError):  # a record written by hand
                info = msgspec.json.decode(record.value, type=BrokerInfo)
        return record, info, revision

    async def brokers(self) -> list[BrokerInfo]:
        listing = await self.store.list_prefix(BROKERS)
        return [msgspec.json.decode(r.value, type=BrokerInfo) for r in listing.records]

    async def broker_url(self, broker_id: str) -> str | None:
        record = await self.store.get(broker_key(broker_id))
        return None if record is None else msgspec.json.decode(record.value, type=BrokerInfo).url

    # ------------------------------------------------------------------ topics

    async def get(self, name: TopicName) -> TopicRecord | None:
        record = await self.store.get(topic_key(name))
        return None if record is None else read_topic(record.key, record.value)

    async def create_persistent(self, name: TopicName) -> str:
        """Create a ``persistent://`` topic placed on a live broker; returns its home."""
        home = await self.place(1)
        record = PersistentTopic(int(time.time() * 1000))
        await self._create(name, record, [(name, home[0])])
        return home[0]

    async def create_scalable(self, name: TopicName, segments: int) -> ScalableTopic:
        record = new_scalable_topic(int(time.time() * 1000), segments)
        homes = await self.place(len(record.segments))
        placements = [
            (name.segment_name(s.id), home) for s, home in zip(record.segments, homes, strict=True)
        ]
        await self._create(name, record, placements)
        return record

    async def _create(
        self, name: TopicName, record: TopicRecord, homes: Sequence[tuple[TopicName, str]]
    ) -> None:
        """Write the homes, then the topic record, which is what makes the topic exist.

        Homes go in steps of :data:`HOMES_PER_STEP` (a topic may have more segments than
        one atomic step can place). A crash in between leaves homes of a topic that does
        not exist, which the next create of that name overwrites. Each step also checks
        that the topic record does not exist: a create that stalled after finding no topic,
        while another made it (and stored messages on its homes), never writes its homes
        over the live topic's.

        Raises:
            TopicExists: the topic exists (nothing of this create was written since).
        """
        if await self.store.get(topic_key(name)) is not None:
            raise TopicExists(f"{name} already exists")
        for i in range(0, len(homes), HOMES_PER_STEP):
            try:
                await self.store.commit(
                    [
                        Check(topic_key(name), MUST_NOT_EXIST),
                        *(
                            Put(
                                home_key(ledger),
                                msgspec.json.encode(home),
                                indexes={HOMES_BY_BROKER: home},
                            )
                            for ledger, home in homes[i : i + HOMES_PER_STEP]
                        ),
                    ]
                )
            except AlreadyExists as e:
                raise TopicExists(f"{name} already exists") from e
        try:
            await self.store.put(
                topic_key(name), encode_topic(record), expected_version=MUST_NOT_EXIST
            )
        except AlreadyExists as e:
            raise TopicExists(f"{name} already exists") from e
        log.info("topic created: %s; %s", name, _placements(record, homes))

    async def place(self, count: int) -> list[str]:
        """Homes for ``count`` new ledgers: the live brokers with the fewest, in turn
        (never a draining one)."""
        live = [b for b in await self.brokers() if not b.draining]
        if not live:
            raise NoBrokers("no broker is registered (and not draining)")
        load = {}
        for broker in live:
            listing = await self.store.index_range(HOMES_BY_BROKER, broker.broker_id)
            load[broker.broker_id] = len(listing.entries)
        chosen = []
        for _ in range(count):
            least = min(sorted(load), key=lambda b: load[b])
            chosen.append(least)
            load[least] += 1
        return chosen

    async def update_properties(
        self,
        name: TopicName,
        updates: dict[str, str],
        removals: tuple[str, ...],
        check: Callable[[dict[str, str]], None] | None = None,
    ) -> None:
        """Change a topic record's properties with a CAS (retried if the record moved).

        ``check`` sees the resulting properties before each attempt and may raise to refuse
        them (the limits hold on exactly the set that is written)."""
        while True:
            record = await self.store.get(topic_key(name))
            if record is None:
                raise KeyError(str(name))
            topic = read_topic(record.key, record.value)
            properties = {**topic.properties, **updates}
            for key in removals:
                properties.pop(key, None)
            if check is not None:
                check(properties)
            changed = msgspec.structs.replace(topic, properties=properties)
            try:
                await self.store.put(
                    topic_key(name), encode_topic(changed), expected_version=record.version
                )
                return
            except BadVersion:
                continue

    async def homes_on(self, broker_id: str, *, limit: int) -> tuple[list[str], bool]:
        """The ledgers (topics and segments) whose home is ``broker_id``, at most ``limit``
        of them in key order, and whether there are more. One index range read; the broker
        need not be alive. A crash half-way through a create or delete can leave a home
        whose topic does not exist: it is listed (the answer errs towards "holds data")."""
        listing = await self.store.index_range(HOMES_BY_BROKER, broker_id, limit=limit)
        ledgers = [unquote(e.key[len(HOMES) :]) for e in listing.entries]
        return ledgers, listing.more

    async def home_of(self, ledger: TopicName) -> str | None:
        record = await self.store.get(home_key(ledger))
        return None if record is None else str(msgspec.json.decode(record.value))

    async def move_home(self, ledger: TopicName, *, away_from: str, to: str) -> str | None:
        """Move ``ledger``'s home from broker ``away_from`` to ``to`` (its ledgers are
        replicated; ``away_from`` is gone, or is draining). One compare-and-set on the home
        record, so of brokers racing to move it one wins. Returns the home after the
        attempt (``to`` if this one moved it; None: the topic was deleted)."""
        key = home_key(ledger)
        record = await self.store.get(key)
        if record is None:
            return None
        home = str(msgspec.json.decode(record.value))
        if home != away_from:
            return home
        try:
            await self.store.put(
                key,
                msgspec.json.encode(to),
                expected_version=record.version,
                indexes={HOMES_BY_BROKER: to},
            )
        except (BadVersion, NotFound):
            return await self.home_of(ledger)
        log.warning("%s: moved from broker %s to broker %s", ledger, away_from, to)
        return to

    async def retire_segment(self, segment: TopicName, *, home_version: int) -> bool:
        """Mark sealed ``segment`` RETIRED in its topic's record (one compare-and-set; see
        :func:`segtxn.topics.dag.retire`), if its home record is still at ``home_version``
        (the broker retiring it still holds it: no drain or take-over meanwhile). False,
        changing nothing: the topic is gone, a split or merge is pending, the segment is
        not SEALED or a parent is not retired, or a record changed meanwhile (the caller
        looks again later)."""
        return await self._change_dag(
            segment, dag.retire, (Check(home_key(segment), home_version),)
        )

    async def prune_segment(self, segment: TopicName) -> bool:
        """Remove RETIRED ``segment`` from its topic's record and delete its home, in one
        store step (:func:`segtxn.topics.dag.prune`: only once its parents are gone). False,
        changing nothing: not prunable now, or the record changed meanwhile."""
        return await self._change_dag(segment, dag.prune, (Delete(home_key(segment)),))

    async def _change_dag(
        self,
        segment: TopicName,
        change: Callable[[ScalableTopic, int], ScalableTopic],
        also: Sequence[Delete | Check],
    ) -> bool:
        name, segment_id = segment.parent(), segment.segment
        assert segment_id is not None, segment
        record = await self.store.get(topic_key(name))
        if record is None:
            return False
        topic = read_topic(record.key, record.value)
        if not isinstance(topic, ScalableTopic) or topic.pending is not None:
            return False
        try:
            changed = change(topic, segment_id)
        except dag.DagError:
            return False
        put = Put(topic_key(name), encode_topic(changed), expected_version=record.version)
        try:
            await self.store.commit([put, *also])
        except (BadVersion, NotFound):
            return False
        return True

    async def list_topics(self, tenant: str, namespace: str) -> list[TopicName]:
        out = []
        for domain in ("persistent", "topic"):
            listing = await self.store.list_prefix(f"{TOPICS}{domain}/{tenant}/{namespace}/")
            out += [
                TopicName.from_path(r.key[len(TOPICS) :], check_lengths=False)
                for r in listing.records
            ]
        return out

    async def mark_deleting(
        self, name: TopicName, precondition: PropertyPrecondition | None = None
    ) -> DeletionMark | None:
        """Mark scalable topic ``name`` as being deleted: one compare-and-set on its record,
        made again on the record as it is now while it changes under it. Returns the mark,
        None when there is no such topic. Marked, the topic starts no split or merge and its
        segments may be deleted; nothing unmarks it: the mark commits to the deletion.

        ``precondition`` is checked on the version of the record each attempt replaces, so
        it holds on exactly the version marked: a record that changes between the check and
        the write (a property changed, the topic deleted and created again) fails the write
        and is checked again as it is then. A record marked already (a deletion that stopped
        half-way) is checked too (it keeps its properties), and its mark returned.

        Raises:
            PreconditionFailed: ``precondition`` does not hold on the record as it is;
                nothing was written.
        """
        while True:
            found = await self.store.get(topic_key(name))
            topic = None if found is None else read_topic(found.key, found.value)
            if found is None or not isinstance(topic, ScalableTopic):
                return None
            if precondition is not None and not precondition.holds(topic.properties):
                raise PreconditionFailed(precondition.refusal(str(name), topic.properties))
            if topic.deleting:
                return DeletionMark(topic, found.created_version)
            marked = msgspec.structs.replace(topic, deleting=True)
            try:
                await self.store.put(
                    topic_key(name), encode_topic(marked), expected_version=found.version
                )
            except (BadVersion, NotFound):
                continue  # changed meanwhile (a split, a retirement, a property): look again
            return DeletionMark(marked, found.created_version)

    async def marked(self, name: TopicName, mark: DeletionMark) -> ScalableTopic | None:
        """The record ``mark`` marked, as it is now (its segments may have changed since:
        a retirement, a split planned before the mark and finished after it); None when that
        topic is gone (another deletion finished it; the name may hold a new topic)."""
        found = await self.store.get(topic_key(name))
        if found is None or found.created_version != mark.created_version:
            return None
        topic = read_topic(found.key, found.value)
        return topic if isinstance(topic, ScalableTopic) else None

    async def finish_deleting(self, name: TopicName, mark: DeletionMark) -> bool:
        """Delete the record of marked topic ``name`` and its segments' homes (their data
        deleted by then; the children of a split or merge it stopped too), if the record is
        still the one ``mark`` marked. Returns False when there was none to delete (another
        deletion finished it).

        Each record and home is deleted by a compare-and-set on the version read, so a topic
        created again under the name after another deletion finished this one, and the
        homes its creation wrote, are never deleted. The record and the first homes go in
        one store step (every home of a topic of up to ``HOMES_PER_STEP - 1`` segments);
        the rest after it, in steps: a crash in between leaves homes of a topic that does
        not exist, which the next create of that name overwrites, as after a failed create.
        """
        while True:
            found = await self.store.get(topic_key(name))
            if found is None or found.created_version != mark.created_version:
                return False
            topic = read_topic(found.key, found.value)
            ids = (
                [s.id for s in topic.segments] + topic.creating()
                if isinstance(topic, ScalableTopic)
                else []
            )
            ledgers = [name.segment_name(i) for i in ids]
            deletes = [Delete(topic_key(name), expected_version=found.version)]
            for ledger in ledgers:
                home = await self.store.get(home_key(ledger))
                if home is not None:
                    deletes.append(Delete(home.key, expected_version=home.version))
            try:
                await self.store.commit(deletes[:HOMES_PER_STEP])
            except (BadVersion, NotFound):
                continue  # the record or a home changed meanwhile (a move): look again
            rest = deletes[HOMES_PER_STEP:]
            for i in range(0, len(rest), HOMES_PER_STEP):
                await self._delete_unchanged(rest[i : i + HOMES_PER_STEP])
            log.info("topic deleted: %s (%d ledgers)", name, len(ledgers))
            return True

    async def _delete_unchanged(self, deletes: Sequence[Delete]) -> None:
        """Apply ``deletes`` (each with its expected version) in one step, or, when one no
        longer holds (a home a new topic of the name wrote since), one by one, skipping
        those that changed."""
        try:
            await self.store.commit(deletes)
        except (BadVersion, NotFound):
            for delete in deletes:
                with contextlib.suppress(BadVersion, NotFound):
                    await self.store.commit([delete])

    async def delete(self, name: TopicName, record: TopicRecord) -> None:
        ledgers = (
            [name.segment_name(s.id) for s in record.segments]
            if isinstance(record, ScalableTopic)
            else [name]
        )
        # the record first, with as many homes as one store step takes (all of them for a
        # topic of up to HOMES_PER_STEP - 1 segments); the rest after, in steps. A crash in
        # between leaves homes of a topic that does not exist: the next create of that name
        # overwrites them, as after a failed create.
        deletes = [Delete(topic_key(name))] + [Delete(home_key(ledger)) for ledger in ledgers]
        for i in range(0, len(deletes), HOMES_PER_STEP):
            await self.store.commit(deletes[i : i + HOMES_PER_STEP])
        log.info("topic deleted: %s (%d ledgers)", name, len(ledgers))
