"""Kopf daemon of ScalableTopic: automatic split and merge by load, for the topics that opt
in (``spec.autoscale.enabled: true``).

One daemon per opted-in resource (Kopf starts it when the filter matches and stops it when
it no longer does). Every ``intervalSeconds`` it reads the topic's stats through the brokers'
admin API — one call that gathers every segment's counters from its home broker — and from
two readings computes each active segment's rates (:mod:`segtxn.topics.segmentload`); then
:func:`segtxn.topics.autoscale.decide` says split X, merge X and Y, or nothing, and the
daemon makes that change with the same admin split/merge the ``targetSegments`` handler
uses. Why the rates are computed here and not on the brokers: the counters already exist
and are already gathered per topic by one stats call, so brokers keep no history and the
store sees no extra writes; the cost is that a restarted operator needs one interval before
it has rates again and starts every merge window afresh (it only delays a change, never
makes one sooner).

What it decided is visible: status ``autoscale.lastDecision`` (action, segments, reason,
message, time) and ``lastSplitTime``/``lastMergeTime``, condition ``AutoScaling`` (True with
the decision's reason while it works; False with why when it cannot: ``InvalidPolicy``,
``TargetSegmentsSet``, the brokers' error name, ``Disabled`` once opted out), an
``AutoSplit``/``AutoMerge`` event for each change. The status is written when the decision's
reason changes or a change is made, not every tick (the numbers in a message move every
tick; the API server need not).

The cooldowns count from the topic's last split and merge, automatic or not: the daemon's
own (in status, so they survive a restart) and the brokers' ``lastChange`` (a manual split
through the admin API or ``targetSegments`` starts the split cooldown too, as PIP-483 asks).
A ``targetSegments`` in the spec fixes the topology: the daemon then decides nothing and
says so (the CRD refuses the two together; this covers an API server without CEL rules).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kopf

from segtxn.client.admin import Admin
from segtxn.client.errors import Timeout
from segtxn.operator import topicowner, topicplan
from segtxn.operator.kube import KubeError
from segtxn.operator.runtime import (
    API,
    GROUP,
    VERSION,
    admin,
    namespaced,
    now,
    reason,
    runtime_of,
    track,
    transient,
)
from segtxn.operator.status import condition
from segtxn.protocol.errors import ServerError
from segtxn.topics.autoscale import (
    Action,
    Decision,
    History,
    Policy,
    PolicyError,
    changes_of,
    decide,
    policy_from,
    segments_of,
    track_cold,
)
from segtxn.topics.segmentload import Load, MalformedStats, Reading, rates, reading

INTERVAL_S = 30.0
"""Default ``spec.autoscale.intervalSeconds``: the window the rates are measured over."""
CONDITION = "AutoScaling"

log = logging.getLogger(__name__)


def opted_in(spec: kopf.Spec, **_: Any) -> bool:
    """Kopf's filter: the daemon runs for a resource while this holds."""
    return bool((spec.get("autoscale") or {}).get("enabled"))


class Blocked(Exception):
    """This tick cannot decide (the reason is a condition's); the next one tries again."""

    def __init__(self, why: str, message: str, *, warn: bool = False) -> None:
        super().__init__(message)
        self.why = why
        self.warn = warn


@dataclass
class Sampler:
    """What one topic's daemon keeps between ticks, in memory."""

    previous: Reading | None = None
    cold_since: dict[int, float] = field(default_factory=dict)
    written: tuple[str, str] | None = None
    """(condition status, reason) last written: the status is rewritten when it changes."""

    def observe(self, current: Reading, policy: Policy) -> dict[int, Load]:
        """Rates since the previous reading (none at the first), and coldness tracked."""
        loads = rates(self.previous, current) if self.previous else {}
        if self.previous is not None:
            self.cold_since = track_cold(self.cold_since, loads, policy, self.previous.at_s)
        self.previous = current
        return loads


def _seconds(stamp: object) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _latest(*found: float | None) -> float | None:
    known = [f for f in found if f is not None]
    return max(known) if known else None


def history(
    status: Mapping[str, Any], stats: Mapping[str, Any], cold_since: Mapping[int, float]
) -> History:
    """When the topic last split and merged: the later of the daemon's own (status) and
    the brokers' last change (any split or merge, manual ones included)."""
    mine = status.get("autoscale") or {}
    theirs = changes_of(stats)
    return History(
        last_split_s=_latest(_seconds(mine.get("lastSplitTime")), theirs.last_split_s),
        last_merge_s=_latest(_seconds(mine.get("lastMergeTime")), theirs.last_merge_s),
        cold_since_s=cold_since,
    )


def _stamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _apply(brokers: Admin, topic: str, decision: Decision) -> Mapping[str, Any] | None:
    """Make the change; the DAG after it (None for NONE).

    Raises:
        Blocked: the brokers refused it or did not answer (a Warning for a refusal).
    """
    try:
        if decision.action is Action.SPLIT:
            return await brokers.split(topic, decision.segments[0])
        if decision.action is Action.MERGE:
            return await brokers.merge(topic, *decision.segments)
    except (ServerError, Timeout) as e:
        raise Blocked(reason(e), f"{decision.action} of {topic} failed: {e}",
                      warn=not transient(e)) from e  # fmt: skip
    return None


@dataclass
class Tick:
    """One evaluation of one topic: read, decide, change, and the status to write."""

    runtime_memo: Any
    body: kopf.Body
    sampler: Sampler

    async def run(self) -> None:
        spec, meta = self.body.spec, self.body.meta
        namespace = namespaced(meta.namespace)
        topic = topicplan.topic_of(spec)
        status_now = dict(self.body.status)
        try:
            decision, dag, at = await self._decide(namespace, topic, spec, status_now)
        except Blocked as e:
            fresh = self.sampler.written != ("False", e.why)  # warned once, not every tick
            await self.write(False, e.why, str(e), {})
            if e.warn and fresh:
                kopf.warn(self.body, reason=e.why, message=f"{topic}: {e}")
            return
        fields: dict[str, Any] = {}
        mine = dict(status_now.get("autoscale") or {})
        if decision.action is not Action.NONE:
            key = "lastSplitTime" if decision.action is Action.SPLIT else "lastMergeTime"
            mine[key] = _stamp(at)
            kopf.info(self.body, reason=f"Auto{decision.action}",
                      message=f"{topic}: {decision.message}")  # fmt: skip
            fields.update(topicplan.topic_status(dag or {}, topic))
        elif self._shown() == self.sampler.written == ("True", decision.why.value):
            return  # the same reason as last written, and still there: nothing new to say
        mine["lastDecision"] = {
            "action": decision.action.value,
            "segments": list(decision.segments),
            "reason": decision.why.value,
            "message": decision.message,
            "time": _stamp(at),
        }
        fields["autoscale"] = mine
        await self.write(True, decision.why.value, decision.message, fields)

    async def _decide(
        self, namespace: str, topic: str, spec: Mapping[str, Any], status: Mapping[str, Any]
    ) -> tuple[Decision, Mapping[str, Any] | None, float]:
        try:
            policy = policy_from(spec.get("autoscale") or {})
        except PolicyError as e:
            raise Blocked("InvalidPolicy", str(e), warn=True) from e
        if spec.get("targetSegments") is not None:
            fixed = "targetSegments fixes the topology: remove it to scale by load"
            raise Blocked("TargetSegmentsSet", fixed)
        runtime = runtime_of(self.runtime_memo)
        try:
            brokers = await admin(runtime, namespace, str(spec["clusterRef"]))
            self._check_owner(namespace, topic, await brokers.properties(topic), status)
            stats = await brokers.stats(topic)
            at = time.time()
            loads = self.sampler.observe(reading(stats, at), policy)
        except kopf.TemporaryError as e:  # the cluster does not exist (yet)
            raise Blocked("ClusterUnavailable", str(e)) from e
        except (ServerError, Timeout) as e:
            raise Blocked(reason(e), f"reading the load of {topic}: {e}") from e
        except MalformedStats as e:
            raise Blocked("MalformedStats", str(e), warn=True) from e
        found = history(status, stats, self.sampler.cold_since)
        decision = decide(segments_of(stats), loads, policy, found, at)
        return decision, await _apply(brokers, topic, decision), at

    def _check_owner(
        self, namespace: str, topic: str, found: Mapping[str, str], status: Mapping[str, Any]
    ) -> None:
        """A topic this resource did not create is not reshaped (:mod:`.topicowner`)."""
        owner = topicowner.Owner(str(self.body.meta.uid), f"{namespace}/{self.body.meta.name}")
        if not topicowner.owns(found, owner, creating=status.get("creating") == owner.uid):
            refused = topicowner.ForeignTopic(topic, found)
            raise Blocked(refused.reason, str(refused))

    def _shown(self) -> tuple[str, str] | None:
        """(status, reason) of condition ``AutoScaling`` as the resource has it now: the
        ScalableTopic handler rewrites the conditions too, from what it read when it began,
        and may have dropped or rolled back this one."""
        for c in self.body.status.get("conditions") or ():
            if c.get("type") == CONDITION:
                return str(c.get("status")), str(c.get("reason"))
        return None

    async def write(self, on: bool, why: str, message: str, fields: Mapping[str, Any]) -> None:
        """Condition ``AutoScaling`` (and ``fields``) to the status subresource now. A
        failure is logged and the status written again next tick."""
        value = ("True" if on else "False", why)
        if not fields and self._shown() == self.sampler.written == value:
            return
        meta = self.body.meta
        conditions = condition(self.body.status.get("conditions"), kind=CONDITION, status=on,
                               reason=why, message=message, now=now(),
                               generation=meta.get("generation"))  # fmt: skip
        try:
            await runtime_of(self.runtime_memo).kube.patch_status(
                API, "ScalableTopic", str(meta.namespace), str(meta.name),
                {**fields, "conditions": conditions},
            )  # fmt: skip
        except (KubeError, aiohttp.ClientError) as e:
            log.warning("%s: autoscale status not written (%s): %s", meta.name, why, e)
            self.sampler.written = None
            return
        self.sampler.written = value


@kopf.daemon(GROUP, VERSION, "scalabletopics", when=opted_in, cancellation_timeout=10)
async def autoscale(*, body: kopf.Body, memo: Any, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """Evaluate the topic every ``intervalSeconds`` until opted out, deleted, or the
    operator stops; opted out, condition ``AutoScaling`` turns False (``Disabled``)."""
    if track(memo, stopped):  # started again while the operator stops: nothing to do
        return
    tick = Tick(memo, body, Sampler())
    while not stopped:
        await tick.run()
        interval = float((body.spec.get("autoscale") or {}).get("intervalSeconds", INTERVAL_S))
        await stopped.wait(max(interval, 1.0))
    if stopped.reason is not None and kopf.DaemonStoppingReason.FILTERS_MISMATCH in stopped.reason:
        tick.sampler.written = None
        await tick.write(False, "Disabled", "spec.autoscale.enabled is not true", {})
