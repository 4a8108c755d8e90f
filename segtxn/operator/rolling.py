"""The brokers' rolling restart, driven by the operator: one broker at a time, drained
first when it can be, its status kept so a restarted operator goes on where it stopped.

The brokers' StatefulSet is ``OnDelete`` (:func:`.render.render_cluster`): its controller
gives a *new* pod the current template (its ``status.updateRevision``) but replaces no
running pod by itself. A change that alters the pod template (image, the configuration
hash annotation, arguments) therefore leaves pods on an older revision (their
``controller-revision-hash`` label), and this module replaces them, each tick of the
cluster's status timer doing at most one step:

1. **Pick** the highest ordinal whose pod is not on the update revision (``broker k of
   n``, ``k = n - ordinal``), once every *other* broker's pod exists, is not terminating
   and is Ready (one broker down at a time, as the PodDisruptionBudget says).
2. **Drain** it when the StatefulSet runs with ``--replication``: ``POST
   /admin/v2/brokers/{id}/drain`` through the brokers' Service (any broker redirects it to
   that one), then ``GET .../homes`` until it holds nothing. A broker that answers
   NotAllowed runs without replication (turned on in this very change): it is replaced
   undrained. Without replication there is no drain: its topics wait for it, as they
   would for any restart.
3. **Replace** it: evict its pod (the Eviction subresource, with the pod's uid as
   precondition: a pod replaced meanwhile is left alone); the controller creates it again
   on the update revision, with the same volume. An eviction honours the
   PodDisruptionBudget: one that refuses (429, e.g. a pod of the set went down meanwhile)
   leaves the broker ``Evicting``, tried again each tick for
   :attr:`RollSettings.evict_timeout_s`.
4. **Wait** until that pod runs the update revision and is Ready (a broker's ``/readyz``
   is Ready only once it serves: with its topics loaded, without replication), then go
   on with the next.

**Where it stands** is kept in ``status.roll`` (:class:`.rollstate.Record`: the broker in
progress, its step, since when; :mod:`.rollstate` holds the roll's state and settings) and
said in condition ``Rolling`` (``broker k of n: ...``). A restarted operator reads the
record and finishes that broker before picking another; a new change mid-roll does too (a
drained broker is not left behind while others go). A crash between two steps repeats at
most the last one, and each is idempotent: draining again moves what is left, evicting
checks the uid.

**When a step fails**: a broker whose drain does not empty it within
:attr:`RollSettings.drain_timeout_s`, whose pod cannot be evicted within
:attr:`RollSettings.evict_timeout_s`, or whose new pod is not Ready within
:attr:`RollSettings.ready_timeout_s`, stops the roll (``Rolling`` False and ``Degraded``
True, reason ``RollStalled``, naming it; one Warning event). A broker whose drain or
eviction stalled is undrained (new topics may be placed on it again) and keeps running.
The roll is tried again, from that broker, after :attr:`RollSettings.retry_s` or as soon
as the StatefulSet's update revision changes (a new spec).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp
import kopf

from segtxn.client.admin import Admin
from segtxn.client.errors import Timeout
from segtxn.operator.kube import EvictionRefused, KubeError
from segtxn.operator.rollstate import Pod, Record, RollSettings, Step
from segtxn.operator.status import condition
from segtxn.protocol.errors import InvalidArgument, NotAllowed, ServerError


class Kube(Protocol):
    """What a roll needs of Kubernetes (:class:`.kube.Kube` has it)."""

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any: ...

    async def evict_pod(self, namespace: str, name: str, uid: str) -> bool: ...


@dataclass
class Outcome:
    """What a tick leaves: the record to store (None: no broker in progress), condition
    ``Rolling`` (None: no roll to speak of), a new stall, and events to post."""

    record: Record | None
    rolling: tuple[bool, str, str] | None
    stalled: str | None = None
    events: list[tuple[str, str]] = field(default_factory=list)
    """(reason, message) of Normal events."""


STAMP = "%Y-%m-%dT%H:%M:%SZ"


def _stamp(at: datetime.datetime) -> str:
    return at.strftime(STAMP)


def _seconds_since(since: str, now: datetime.datetime) -> float:
    then = datetime.datetime.strptime(since, STAMP).replace(tzinfo=datetime.UTC)
    return (now - then).total_seconds()


@dataclass(frozen=True)
class Roll:
    """One cluster's brokers, as one tick sees them."""

    kube: Kube
    admin: Admin
    settings: RollSettings
    namespace: str
    statefulset: Mapping[str, Any]
    now: datetime.datetime

    @property
    def name(self) -> str:
        return str(self.statefulset["metadata"]["name"])

    @property
    def replicas(self) -> int:
        return int(self.statefulset.get("spec", {}).get("replicas", 0))

    @property
    def replicated(self) -> bool:
        """The StatefulSet's pods run with ``--replication`` (their topics can move)."""
        containers = self.statefulset["spec"]["template"]["spec"].get("containers") or []
        args = containers[0].get("args") or [] if containers else []
        return any(str(a).startswith("--replication") for a in args)

    def target(self) -> str | None:
        """The revision every pod should run: the StatefulSet's update revision, once its
        controller has seen the latest template; None otherwise (or when its pods are
        not the operator's to replace: not ``OnDelete``)."""
        spec, status = self.statefulset.get("spec", {}), self.statefulset.get("status") or {}
        if (spec.get("updateStrategy") or {}).get("type") != "OnDelete":
            return None
        generation = self.statefulset.get("metadata", {}).get("generation")
        observed = status.get("observedGeneration")
        if generation is not None and (observed is None or int(observed) < int(generation)):
            return None
        revision = status.get("updateRevision")
        return str(revision) if revision else None

    def which(self, broker: str) -> str:
        """``broker k of n (name)``."""
        ordinal = int(broker.rsplit("-", 1)[1])
        return f"broker {self.replicas - ordinal} of {self.replicas} ({broker})"

    async def pods(self) -> dict[str, Pod | None]:
        """Every broker's pod by name (None: there is none now)."""
        found: dict[str, Pod | None] = {}
        for ordinal in range(self.replicas):
            name = f"{self.name}-{ordinal}"
            raw = await self.kube.get("v1", "Pod", self.namespace, name)
            found[name] = None if raw is None else Pod.parse(raw)
        return found

    async def tick(self, previous: Record | None) -> Outcome:
        """One step of the roll from ``previous`` (``status.roll``); what to store.

        Raises:
            KubeError, aiohttp.ClientError: Kubernetes failed (the next tick retries).
        """
        target = self.target()
        if target is None:
            return Outcome(previous, None)
        pods = await self.pods()
        record = previous if previous is None or previous.broker in pods else None
        if record is not None and record.step is Step.STALLED:
            retry = record.revision != target or _seconds_since(record.since, self.now) >= 0
            if not retry:
                return Outcome(record, (False, "RollStalled", self._stalled_text(record)))
            pod = pods[record.broker]
            fresh = Step.DRAINING if self._drainable(pod, target) else Step.REPLACING
            record = record.to(fresh, _stamp(self.now))
        if record is not None:
            return await self._continue(replace(record, revision=target), pods, target)
        return await self._pick(pods, target)

    def _drainable(self, pod: Pod | None, target: str) -> bool:
        return (
            self.replicated
            and pod is not None
            and not pod.terminating
            and pod.ready
            and pod.revision != target
        )

    async def _pick(self, pods: Mapping[str, Pod | None], target: str) -> Outcome:
        old = [name for name, pod in pods.items() if pod is not None and pod.revision != target]
        if not old:
            absent = [name for name, pod in pods.items() if pod is None]
            if absent:
                return Outcome(None, (True, "Waiting", f"waiting for {', '.join(absent)}"))
            return Outcome(None, (False, "UpToDate", f"{len(pods)} brokers run {target}"))
        broker = max(old, key=lambda n: int(n.rsplit("-", 1)[1]))
        unready = [
            name
            for name, pod in pods.items()
            if name != broker and (pod is None or pod.terminating or not pod.ready)
        ]
        if unready:
            waiting = f"{self.which(broker)} is next once {', '.join(unready)} is ready"
            return Outcome(None, (True, "Waiting", f"{waiting} (one broker down at a time)"))
        pod = pods[broker]
        step = Step.DRAINING if self._drainable(pod, target) else Step.REPLACING
        record = Record(target, broker, step, _stamp(self.now))
        if step is Step.REPLACING:
            return await self._replace(record, pod, "")
        return await self._drain(record, pod)

    async def _continue(
        self, record: Record, pods: Mapping[str, Pod | None], target: str
    ) -> Outcome:
        pod = pods[record.broker]
        if record.step in (Step.DRAINING, Step.EVICTING):
            if pod is None or pod.terminating or pod.revision == target:
                # evicted already (a restart between the eviction and its record)
                return self._replacing(record.to(Step.REPLACING, _stamp(self.now)))
            if record.step is Step.EVICTING:
                return await self._replace(record, pod, "")
            return await self._drain(record, pod)
        if pod is not None and not pod.terminating and pod.revision == target and pod.ready:
            message = f"{self.which(record.broker)} runs {target} and is ready"
            return Outcome(None, (True, "Rolled", message), events=[("Rolled", message)])
        if _seconds_since(record.since, self.now) > self.settings.ready_timeout_s:
            why = f"its new pod was not Ready within {self.settings.ready_timeout_s:g} s"
            return await self._stall(record, why)
        if pod is not None and not pod.terminating and pod.revision != target:
            return await self._replace(record, pod, record.note)  # an old pod again: evict
        return self._replacing(record)

    async def _drain(self, record: Record, pod: Pod | None) -> Outcome:
        """Drain the broker (again: it moves what is left) and, once it holds nothing,
        evict its pod. Past the drain timeout, stall. A broker that is not registered (its
        drain refused InvalidArgument, its homes say so) serves nothing and has nothing to
        drain: its pod is replaced, as one that is not Ready is."""
        if _seconds_since(record.since, self.now) > self.settings.drain_timeout_s:
            why = f"draining did not empty it within {self.settings.drain_timeout_s:g} s"
            return await self._stall(record, f"{why} ({record.note or 'no answer'})", undrain=True)
        left = self.settings.drain_timeout_s - _seconds_since(record.since, self.now)
        refused: InvalidArgument | None = None
        try:
            try:
                answer = await self.admin.drain_broker(record.broker, timeout_s=max(left, 1.0))
            except InvalidArgument as e:  # not registered? its homes say
                answer, refused = {}, e
            homes = await self.admin.broker_homes(record.broker, limit=5)
        except NotAllowed as e:  # it runs without replication: no drain
            note = f"not drained: {e.message}"
            return await self._replace(record, pod, note)
        except ServerError as e:
            return self._draining(replace(record, note=f"{e.name.value}: {e.message}"))
        except Timeout as e:
            return self._draining(replace(record, note=str(e)))
        if refused is not None and not homes.registered:
            return await self._replace(record, pod, "not drained: it is not registered")
        if refused is not None:
            return self._draining(replace(record, note=f"{refused.name.value}: {refused.message}"))
        if not homes.empty:
            failed = answer.get("failed") or {}
            note = f"it still holds {', '.join(homes.homes)}{' and more' if homes.more else ''}"
            if failed:
                note += f"; failed: {'; '.join(f'{k}: {v}' for k, v in list(failed.items())[:3])}"
            return self._draining(replace(record, note=note))
        moved = len(answer.get("moved") or [])
        drained = f"drained ({moved} topics and segments moved)"
        outcome = await self._replace(record, pod, drained)
        outcome.events.insert(0, ("Drained", f"{self.which(record.broker)} {drained}"))
        return outcome

    async def _replace(self, record: Record, pod: Pod | None, note: str) -> Outcome:
        """Evict the broker's pod (its controller makes the new one). A refused eviction
        (a budget) leaves the record ``Evicting``, tried again at the next tick; past
        :attr:`RollSettings.evict_timeout_s` from the first refusal, the roll stalls."""
        if pod is not None and not pod.terminating:
            try:
                await self.kube.evict_pod(self.namespace, pod.name, pod.uid)
            except EvictionRefused as e:
                return await self._refused(record, e)
        if record.step is not Step.REPLACING:
            record = record.to(Step.REPLACING, _stamp(self.now))
        record = replace(record, note=note, since=_stamp(self.now))
        outcome = self._replacing(record)
        done = f"; {note}" if note else ""
        outcome.events.append(("Replacing", f"{self.which(record.broker)}: pod evicted{done}"))
        return outcome

    async def _refused(self, record: Record, refusal: EvictionRefused) -> Outcome:
        if record.step is not Step.EVICTING:
            record = record.to(Step.EVICTING, _stamp(self.now))
        record = replace(record, note=f"eviction refused: {refusal}")
        if _seconds_since(record.since, self.now) > self.settings.evict_timeout_s:
            why = f"its pod could not be evicted within {self.settings.evict_timeout_s:g} s"
            return await self._stall(record, f"{why} ({record.note})", undrain=self.replicated)
        message = f"{self.which(record.broker)}: {record.note}; tried again"
        return Outcome(record, (True, "Evicting", message))

    def _draining(self, record: Record) -> Outcome:
        message = f"{self.which(record.broker)}: draining; {record.note}"
        return Outcome(record, (True, "Draining", message))

    def _replacing(self, record: Record) -> Outcome:
        message = f"{self.which(record.broker)}: waiting for its new pod to be ready"
        return Outcome(record, (True, "Replacing", message))

    async def _stall(self, record: Record, why: str, *, undrain: bool = False) -> Outcome:
        """Stop the roll at ``record``'s broker (undrained first when ``undrain``)."""
        if undrain:
            why = f"{why}; {await undrain_broker(self.admin, record.broker)}"
        retry = self.now + datetime.timedelta(seconds=self.settings.retry_s)
        stalled = record.to(Step.STALLED, _stamp(retry), why)
        message = self._stalled_text(stalled)
        return Outcome(stalled, (False, "RollStalled", message), stalled=message)

    def _stalled_text(self, record: Record) -> str:
        return (
            f"the roll to {record.revision} stopped at {self.which(record.broker)}: "
            f"{record.note}. The other brokers were left as they are; it is tried again at "
            f"{record.since}, or at once when the spec changes"
        )


async def undrain_broker(admin: Admin, broker: str) -> str:
    """Let new topics be placed on ``broker`` again after its drain stalled; what
    happened, for the stall's message (a failure is said, not raised: the roll has
    stopped anyway, and a restart of the broker undrains it too). A broker not registered
    now (the undrain's InvalidArgument) has no drain to stop: gone, it starts undrained;
    still running, its registration lost (a store outage), it registers again still
    draining, until the roll's retry undrains it. Said so, not as a failure."""
    try:
        await admin.undrain_broker(broker)
    except InvalidArgument:
        return (
            f"{broker} is not registered now: gone, it starts undrained; still running, it "
            "registers again still draining until the roll is tried again"
        )
    except (ServerError, Timeout) as e:
        return f"{broker} could not be undrained ({e}): it takes no new topics until it restarts"
    return f"{broker} was undrained: it takes new topics again"


async def step(
    body: kopf.Body,
    *,
    kube: Kube,
    admin: Admin,
    settings: RollSettings,
    brokers: Mapping[str, Any],
    previous: Mapping[str, Any] | None,
    conditions: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, str] | None]:
    """One tick of the roll of SegtxnCluster ``body``'s ``brokers`` (its live
    StatefulSet) from ``previous`` (``status.roll``): ``conditions`` with ``Rolling`` (and
    ``Degraded``) as the tick leaves them, and the new ``status.roll``; its events posted
    (a stall: one Warning).

    Raises:
        kopf.TemporaryError: Kubernetes failed; the timer's next run retries.
    """
    roll = Roll(
        kube,
        admin,
        settings,
        str(body.meta.namespace),
        brokers,
        datetime.datetime.now(datetime.UTC),
    )
    try:
        outcome = await roll.tick(Record.parse(previous))
    except (KubeError, aiohttp.ClientError) as e:
        raise kopf.TemporaryError(f"rolling the brokers: {e!r}", delay=5) from e
    record = None if outcome.record is None else outcome.record.body()
    if outcome.rolling is None:
        return conditions, record
    generation, stamp = body.meta.get("generation"), _stamp(roll.now)
    on, why, message = outcome.rolling
    conditions = condition(conditions, kind="Rolling", status=on, reason=why, message=message,
                           now=stamp, generation=generation)  # fmt: skip
    was_stalled = any(
        c.get("type") == "Degraded" and c.get("reason") == "RollStalled" and c["status"] == "True"
        for c in conditions
    )
    if outcome.stalled is not None or (was_stalled and why != "RollStalled"):
        stalled = outcome.stalled is not None
        conditions = condition(
            conditions,
            kind="Degraded",
            status=stalled,
            reason="RollStalled" if stalled else "RollResumed",
            message=outcome.stalled or message,
            now=stamp,
            generation=generation,
        )
    for reason, text in outcome.events:
        kopf.info(body, reason=reason, message=text)
    if outcome.stalled is not None:
        kopf.warn(body, reason="RollStalled", message=outcome.stalled)
    return conditions, record
