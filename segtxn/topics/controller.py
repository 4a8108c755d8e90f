"""The split/merge controller of scalable topics.

One controller per topic decides topology changes: the broker holding the topic's
controller lease (``/segtxn/elections/topic-controller-<topic>``); other brokers forward
requests to it. A split or merge runs in an order that never loses a message and never
leaves a parent and a child writable at once:

1. **plan**: CAS the topic record with the operation as ``pending`` (child ids and ranges
   decided). A second request for a topic with an operation pending, or for a segment that
   is no longer active, fails clearly. A CAS that loses to a change that leaves the
   active segments as they were (a sealed segment retired or pruned, properties changed:
   the epoch is the same and nothing is pending) is planned again on the record read
   afresh, up to :data:`PLAN_ATTEMPTS` times, rather than failing with ``TopicBusy``: the
   plan depends only on the active segments and ``next_segment_id``, which such a change
   keeps, so the caller would only have retried the same request.
2. **place** each child on a broker (``/homes``), keeping a home written by an earlier,
   interrupted attempt, or by another controller meanwhile: each home is created by a
   compare-and-set on its absence, so a controller that stalled between finding a child
   without a home and writing one (past its lease, while its successor placed, prepared
   and completed the child) never moves it away from its data; and in the same store step
   the topic's record is checked unchanged (same topic, not being deleted, this operation
   still pending), so such a controller never writes a home of a topic deleted meanwhile;
3. **prepare** each child: create it on its home with every subscription of its parents,
   positioned at its start (children are not routable yet: nothing can write to them);
4. **seal** each parent (terminate its ledger): from now on sends to it fail with
   ``TopicTerminatedError`` and clients look the topic up again;
5. **complete**: CAS the record with parents SEALED, children ACTIVE, epoch + 1, no pending
   operation. Watchers of the record (lookup sessions) push the new DAG.

Every step is idempotent, so a controller that dies part-way leaves the ``pending`` intent
for its successor, which finishes it before anything else (:meth:`TopicController.finish`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import msgspec

from segtxn.metastore import (
    MUST_NOT_EXIST,
    AlreadyExists,
    BadVersion,
    Check,
    MetadataStore,
    NotFound,
    Put,
)
from segtxn.protocol.names import TopicName
from segtxn.topics import dag
from segtxn.topics.catalog import HOMES_BY_BROKER, Catalog, home_key, topic_key
from segtxn.topics.model import ChangeInfo, PendingOp, ScalableTopic, encode_topic, read_topic

log = logging.getLogger(__name__)


class SegmentOps(Protocol):
    """What the controller asks of the brokers that hold segments."""

    async def subscriptions(self, segment: TopicName) -> list[str]:
        """The subscriptions of a segment."""

    async def prepare(self, segment: TopicName, subscriptions: list[str]) -> None:
        """Create the segment with these subscriptions at its start (idempotent)."""

    async def seal(self, segment: TopicName) -> None:
        """Terminate the segment's ledger (idempotent)."""


class TopicBusy(Exception):
    """Another split or merge of the topic is in progress, or the topic's record kept
    changing while this one was planned."""


PLAN_ATTEMPTS = 5
"""How many times a split or merge is planned when its compare-and-set keeps losing to
changes that leave the active segments as they were (each one a retire, a prune or a
property change landing between the read and the write)."""


class Controller:
    def __init__(self, store: MetadataStore, catalog: Catalog, ops: SegmentOps) -> None:
        self.store = store
        self.catalog = catalog
        self.ops = ops

    async def split(self, name: TopicName, segment: int, at: int | None = None) -> ScalableTopic:
        """Split ``segment`` of ``name`` (at ``at``, or its midpoint).

        Raises:
            DagError: no such active segment, or a bad split point.
            TopicBusy: another operation on the topic is in progress.
            KeyError: no such scalable topic.
        """
        return await self._change(name, lambda topic: dag.plan_split(topic, segment, at))

    async def merge(self, name: TopicName, first: int, second: int) -> ScalableTopic:
        """Merge two adjacent active segments of ``name`` (same errors as :meth:`split`)."""
        return await self._change(name, lambda topic: dag.plan_merge(topic, first, second))

    async def _change(
        self, name: TopicName, plan: Callable[[ScalableTopic], PendingOp]
    ) -> ScalableTopic:
        topic, version = await self._read(name)
        started = time.perf_counter()
        attempts = 0
        while True:
            if topic.pending is not None:
                raise TopicBusy(f"{name}: a {topic.pending.kind} is in progress")
            op = plan(topic)
            planned = msgspec.structs.replace(topic, pending=op)
            attempts += 1
            try:
                record = await self.store.put(
                    topic_key(name), encode_topic(planned), expected_version=version
                )
                break
            except BadVersion as e:
                fresh, version = await self._read(name)
                if attempts >= PLAN_ATTEMPTS or not _same_active(topic, fresh):
                    raise TopicBusy(f"{name} changed meanwhile; try again") from e
                log.debug(
                    "%s %s: the record changed meanwhile; planning again", op.kind.value, name
                )
                topic = fresh
        log.debug(
            "%s %s planned: segments %s -> %s",
            op.kind.value,
            name,
            ",".join(map(str, op.parents)),
            ",".join(str(c[0]) for c in op.children),
        )
        return await self._execute(name, planned, record.version, started)

    async def finish(self, name: TopicName) -> ScalableTopic | None:
        """Complete the operation an earlier controller left pending, if any, unless the
        topic is being deleted: its deletion stops it (and deletes the children it
        prepared; completed now, they would join the DAG after that)."""
        topic, version = await self._read(name)
        if topic.pending is None or topic.deleting:
            return None
        op = topic.pending
        log.warning(
            "%s %s: finishing an interrupted change (segments %s -> %s, left pending by an "
            "earlier controller)",
            op.kind.value,
            name,
            ",".join(map(str, op.parents)),
            ",".join(str(c[0]) for c in op.children),
        )
        return await self._execute(name, topic, version, time.perf_counter())

    async def _read(self, name: TopicName) -> tuple[ScalableTopic, int]:
        record = await self.store.get(topic_key(name))
        if record is None:
            raise KeyError(str(name))
        topic = read_topic(record.key, record.value)
        if not isinstance(topic, ScalableTopic):
            raise KeyError(str(name))
        return topic, record.version

    async def _execute(
        self, name: TopicName, topic: ScalableTopic, version: int, started: float
    ) -> ScalableTopic:
        op = topic.pending
        if op is None:
            return topic
        children = [name.segment_name(child) for child, _, _ in op.children]
        parents = [name.segment_name(parent) for parent in op.parents]
        await self._place(name, topic, op)
        subscriptions = await self._subscriptions(parents)
        for child in children:
            await self.ops.prepare(child, subscriptions)
        for parent in parents:
            log.debug("%s %s: sealing %s", op.kind.value, name, parent)
            await self.ops.seal(parent)
        # A subscription made on a parent since it was read would be on no child, and
        # nothing written to the children would be kept for it: the children take it too.
        # (One made through the topic from here on reaches them by its fan-out.)
        late = sorted(set(await self._subscriptions(parents)) - set(subscriptions))
        for child in children if late else []:
            await self.ops.prepare(child, late)
        done = dag.complete(topic, op)
        done = msgspec.structs.replace(
            done,
            last_change=ChangeInfo(
                op.kind,
                list(op.parents),
                [c[0] for c in op.children],
                int(time.time() * 1000),
                round((time.perf_counter() - started) * 1000, 3),
            ),
        )
        try:
            await self.store.put(topic_key(name), encode_topic(done), expected_version=version)
        except (BadVersion, NotFound) as e:
            raise TopicBusy(f"{name} changed while completing its {op.kind}") from e
        sealed = [s for s in topic.segments if s.id in op.parents]
        created = [s for s in done.segments if s.id in {c[0] for c in op.children}]
        log.info(
            "%s %s: segments %s -> %s; epoch %d; %s; took %.1f ms",
            op.kind.value,
            name,
            dag.describe(sealed),
            dag.describe(created),
            done.epoch,
            dag.shape(done),
            done.last_change.duration_ms if done.last_change else 0.0,
        )
        return done

    async def _subscriptions(self, parents: list[TopicName]) -> list[str]:
        return sorted({s for parent in parents for s in await self.ops.subscriptions(parent)})

    async def _place(self, name: TopicName, planned: ScalableTopic, op: PendingOp) -> None:
        """Give each child of ``op`` without a home one, in one store step that also checks
        that ``name``'s record is, at that moment, the version read just before: the topic
        ``planned`` was read from (not one created again under the name), not marked
        ``deleting``, with ``op`` still pending. A home of a child is deleted only by its
        topic's deletion (or its prune), which reads the homes once: a controller that
        stalled between finding a child without a home and writing one, while the topic was
        deleted, would otherwise leave a home of a topic that does not exist, counted as
        its broker's load, and kept for the child of the same id of a topic created again
        under the name (on a broker that may be gone).

        Each home is created only if absent, so one written meanwhile, by an earlier
        attempt or by another controller, is kept (the child's data may be on it). A step
        that loses to a change of the record that keeps all of the above (a property
        changed) is made again on the record as it is then.

        Raises:
            KeyError: the topic is gone, or the name holds another one now.
            TopicBusy: the topic is being deleted, or ``op`` is no longer pending (another
                controller completed it).
        """
        children = [name.segment_name(child) for child, _, _ in op.children]
        while True:
            record = await self.store.get(topic_key(name))
            current = None if record is None else read_topic(record.key, record.value)
            if (
                record is None
                or not isinstance(current, ScalableTopic)
                or current.created_ms != planned.created_ms
            ):
                raise KeyError(str(name))
            if current.deleting:
                raise TopicBusy(f"{name} is being deleted: its {op.kind} stops")
            if current.pending != op:
                raise TopicBusy(f"{name}: its {op.kind} was finished by another controller")
            missing = [c for c in children if await self.catalog.home_of(c) is None]
            if not missing:
                return
            homes = await self.catalog.place(len(missing))
            puts = [
                Put(
                    home_key(child),
                    msgspec.json.encode(home),
                    expected_version=MUST_NOT_EXIST,
                    indexes={HOMES_BY_BROKER: home},
                )
                for child, home in zip(missing, homes, strict=True)
            ]
            try:
                await self.store.commit([Check(record.key, record.version), *puts])
            except AlreadyExists:  # a child placed meanwhile: that home is the one
                log.info("%s: a child was placed meanwhile; keeping its home", name)
                continue
            except (BadVersion, NotFound):
                log.debug("%s: the record changed while placing; looking again", name)
                continue
            for child, home in zip(missing, homes, strict=True):
                log.info("segment created: %s, placed on broker %s", child, home)
            return


def _same_active(read: ScalableTopic, fresh: ScalableTopic) -> bool:
    """Whether ``fresh`` has the active segments ``read`` had: the same topic (not one
    deleted and created again under its name), and no split or merge completed (the epoch
    is the same) or started (nothing pending) in between. Retiring and pruning sealed
    segments, and property changes, keep the epoch."""
    return (
        fresh.created_ms == read.created_ms and fresh.epoch == read.epoch and fresh.pending is None
    )
