"""Automatic split and merge by load: the decision, as a pure function (PIP-483's).

Given a topic's segment DAG, each active segment's load (:mod:`.segmentload`), a policy and
when the topic last split and merged, :func:`decide` answers one thing to do now — split
segment X, merge X and Y, or nothing — and why. It does no I/O and reads no clock, so every
rule is tested on its own (tests/topics/test_autoscale.py); the operator's daemon
(``segtxn.operator.autoscaling``) and ``segtxn topics autoscale`` apply it through the
brokers' ordinary split and merge.

The rules, PIP-483's:

- **Split fast.** A segment above any split threshold (msg/s or bytes/s, in or out) is hot;
  the hottest one (highest rate/threshold over the four axes) is split at its midpoint,
  unless the topic has ``max_segments`` active segments already or split less than
  ``split_cooldown_s`` ago (the cooldown coalesces a burst into one split, then lets a topic
  that keeps growing split again). A segment of a single hash cannot split.
- **Merge lazily.** Only when nothing is hot: two *adjacent* active segments that have both
  stayed below every merge threshold for ``merge_window_s`` (:func:`track_cold`) merge —
  the coldest such pair — unless the topic is at ``min_segments``, merged less than
  ``merge_cooldown_s`` ago, their union would be hot at once, or it would take a lineage
  past ``max_dag_depth`` merges.
- **Never flip-flop**: a merge threshold must be below the split threshold on every axis
  (:class:`PolicyError` otherwise) — the dead band between them keeps a merged segment from
  splitting again at once; cooldowns and the depth cap bound the churn that is left.

The depth counts *merges* in a segment's lineage (a segment with two parents is one more
than its deepest parent; a split's children inherit their parent's), as PIP-483 does: it
caps how often one hash range can cycle through split and merge, and never blocks a split
that throughput needs.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from segtxn.topics.model import SegmentInfo, SegmentState
from segtxn.topics.segmentload import AXES, Load

SPLIT_AT = Load(10_000, 50 * 2**20, 50_000, 250 * 2**20)
"""PIP-483's default split thresholds: 10,000 msg/s and 50 MiB/s in; 50,000 msg/s and
250 MiB/s out."""
MERGE_BELOW = Load(1_000, 5 * 2**20, 5_000, 25 * 2**20)
"""PIP-483's default merge thresholds: a tenth of the split ones."""


class PolicyError(ValueError):
    """A policy that cannot work (the message names the knob): a merge threshold not below
    its split threshold, ``min_segments`` above ``max_segments``, a negative duration."""


@dataclass(frozen=True)
class Policy:
    """PIP-483's knobs, with its defaults (seconds; rates per second)."""

    split: Load = SPLIT_AT
    """A segment above any of these is hot."""
    merge: Load = MERGE_BELOW
    """A segment below all of these is cold."""
    split_cooldown_s: float = 60.0
    merge_cooldown_s: float = 300.0
    merge_window_s: float = 300.0
    """How long both segments of a pair must have stayed cold before they merge."""
    max_segments: int = 64
    min_segments: int = 1
    max_dag_depth: int = 10

    def __post_init__(self) -> None:
        for axis, merge, split in zip(AXES, self.merge.axes(), self.split.axes(), strict=True):
            if merge < 0 or split < 0:
                raise PolicyError(f"thresholds cannot be negative ({axis})")
            if merge >= split:
                raise PolicyError(
                    f"the merge threshold ({merge:g} {axis}) must be below the split "
                    f"threshold ({split:g}): else a merged segment splits again at once"
                )
        durations = (self.split_cooldown_s, self.merge_cooldown_s, self.merge_window_s)
        if min(durations) < 0:
            raise PolicyError("cooldowns and the merge window cannot be negative")
        if not 1 <= self.min_segments <= self.max_segments:
            raise PolicyError(
                f"need 1 <= minSegments ({self.min_segments}) <= maxSegments ({self.max_segments})"
            )
        if self.max_dag_depth < 0:
            raise PolicyError("maxDagDepth cannot be negative")


@dataclass(frozen=True)
class History:
    """What the decision remembers between ticks: when the topic last split and merged
    (seconds, same clock as ``now``; None: never, as far as is known) and since when each
    active segment has been cold (:func:`track_cold`)."""

    last_split_s: float | None = None
    last_merge_s: float | None = None
    cold_since_s: Mapping[int, float] | None = None


class Action(enum.StrEnum):
    SPLIT = "Split"
    MERGE = "Merge"
    NONE = "None"


class Why(enum.StrEnum):
    """A decision's reason, for a condition's ``reason`` (the message gives the numbers)."""

    HOT = "HotSegment"
    COLD = "ColdPair"
    STEADY = "WithinThresholds"
    NO_LOAD = "NoLoadYet"
    SPLIT_COOLDOWN = "SplitCooldown"
    MAX_SEGMENTS = "MaxSegments"
    UNSPLITTABLE = "Unsplittable"
    NOT_COLD_LONG_ENOUGH = "NotColdLongEnough"
    MERGE_COOLDOWN = "MergeCooldown"
    MIN_SEGMENTS = "MinSegments"
    MAX_DAG_DEPTH = "MaxDagDepth"


@dataclass(frozen=True)
class Decision:
    action: Action
    segments: tuple[int, ...]
    """The segment to split, or the pair to merge (lower range first); empty for NONE."""
    why: Why
    message: str


def segments_of(dag: Mapping[str, Any]) -> list[SegmentInfo]:
    """The segments of a DAG as the brokers' admin API answers it (stats, split, merge)."""
    return [
        SegmentInfo(
            id=int(s["id"]),
            lo=int(s["range"][0]),
            hi=int(s["range"][1]),
            state=SegmentState(s["state"]),
            parents=[int(p) for p in s.get("parents", [])],
            children=[int(c) for c in s.get("children", [])],
        )
        for s in dag["segments"]
    ]


def changes_of(stats: Mapping[str, Any]) -> History:
    """When the topic last split or merged, as its stats' ``lastChange`` says (any change:
    automatic, ``targetSegments``, or by hand); one of the two is unknown (None)."""
    change = stats.get("lastChange") or {}
    at = float(change["finishedMs"]) / 1000 if change.get("finishedMs") else None
    kind = change.get("kind")
    return History(
        last_split_s=at if kind == "split" else None,
        last_merge_s=at if kind == "merge" else None,
    )


def merge_depth(segments: Sequence[SegmentInfo]) -> dict[int, int]:
    """Each segment's merge depth: merges in its lineage (parents before children: ids
    grow as the DAG does, so ascending ids are a topological order)."""
    depth: dict[int, int] = {}
    for s in sorted(segments, key=lambda s: s.id):
        inherited = max((depth.get(p, 0) for p in s.parents), default=0)
        depth[s.id] = inherited + (1 if len(s.parents) > 1 else 0)
    return depth


def _exceeds(load: Load, threshold: Load) -> float:
    """How far ``load`` is past ``threshold``: the largest rate/threshold ratio (> 1: hot)."""
    return max(
        (v / t if t > 0 else math.inf) if v > t else 0.0
        for v, t in zip(load.axes(), threshold.axes(), strict=True)
    )


def _over(load: Load, threshold: Load) -> str:
    """The axes of ``load`` above ``threshold``, as ``12.0 msg/s in > 10``."""
    return ", ".join(
        f"{v:.1f} {axis} > {t:g}"
        for axis, v, t in zip(AXES, load.axes(), threshold.axes(), strict=True)
        if v > t
    )


def is_cold(load: Load, policy: Policy) -> bool:
    return all(v < t for v, t in zip(load.axes(), policy.merge.axes(), strict=True))


def track_cold(
    previous: Mapping[int, float] | None,
    loads: Mapping[int, Load],
    policy: Policy,
    window_start_s: float,
) -> dict[int, float]:
    """Since when each segment has been cold, given the loads of a window that began at
    ``window_start_s``: a segment cold now keeps its earlier "since" (else the window's
    start); one not cold, or with no load measured, drops out (its coldness is not known
    to have lasted)."""
    before = previous or {}
    return {
        segment: before.get(segment, window_start_s)
        for segment, load in loads.items()
        if is_cold(load, policy)
    }


def _ago(since: float | None, now: float) -> str:
    return "never" if since is None else f"{now - since:.0f} s ago"


def decide(
    segments: Sequence[SegmentInfo],
    loads: Mapping[int, Load],
    policy: Policy,
    history: History,
    now_s: float,
) -> Decision:
    """The one change to make now (see the module's docstring for the rules), or NONE
    with the reason. ``loads`` may lack segments (no rate measured yet): such a segment is
    neither hot nor cold."""
    active = sorted((s for s in segments if s.state is SegmentState.ACTIVE), key=lambda s: s.lo)
    measured = [s for s in active if s.id in loads]
    if not measured:
        return _nothing(
            Why.NO_LOAD, "no rate yet: the first reading, or every segment new since the last"
        )
    hot = sorted(
        ((_exceeds(loads[s.id], policy.split), s) for s in measured),
        key=lambda p: (-p[0], p[1].id),
    )
    hot = [(score, s) for score, s in hot if score > 0]
    if hot:
        return _split(
            hot=hot, active=len(active), loads=loads, policy=policy, history=history, now_s=now_s
        )
    return _merge(
        active=active,
        depth=merge_depth(segments),
        loads=loads,
        policy=policy,
        history=history,
        now_s=now_s,
    )


def _nothing(why: Why, message: str) -> Decision:
    return Decision(Action.NONE, (), why, message)


def _split(
    *,
    hot: list[tuple[float, SegmentInfo]],
    active: int,
    loads: Mapping[int, Load],
    policy: Policy,
    history: History,
    now_s: float,
) -> Decision:
    first = hot[0][1]
    what = f"segment {first.id} is hot ({_over(loads[first.id], policy.split)})"
    if active >= policy.max_segments:
        return _nothing(
            Why.MAX_SEGMENTS, f"{what}; {active} active segments, maxSegments {policy.max_segments}"
        )
    last = history.last_split_s
    if last is not None and now_s - last < policy.split_cooldown_s:
        left = policy.split_cooldown_s - (now_s - last)
        return _nothing(
            Why.SPLIT_COOLDOWN, f"{what}; last split {_ago(last, now_s)}, next in {left:.0f} s"
        )
    splittable = [s for _, s in hot if s.hi > s.lo]
    if not splittable:
        return _nothing(Why.UNSPLITTABLE, f"{what}; it covers a single hash")
    chosen = splittable[0]
    return Decision(
        Action.SPLIT,
        (chosen.id,),
        Why.HOT,
        f"segment {chosen.id} [{chosen.lo:#06x}-{chosen.hi:#06x}] is hot "
        f"({_over(loads[chosen.id], policy.split)})",
    )


def _merge(
    *,
    active: list[SegmentInfo],
    depth: Mapping[int, int],
    loads: Mapping[int, Load],
    policy: Policy,
    history: History,
    now_s: float,
) -> Decision:
    cold = {s.id for s in active if s.id in loads and is_cold(loads[s.id], policy)}
    pairs = [(a, b) for a, b in itertools.pairwise(active) if a.id in cold and b.id in cold]
    if not pairs:
        return _nothing(
            Why.STEADY,
            "no segment above a split threshold, no adjacent pair below every merge threshold",
        )
    since = history.cold_since_s or {}

    def cold_for(s: SegmentInfo) -> float:
        return now_s - since.get(s.id, now_s)

    settled = [p for p in pairs if min(cold_for(p[0]), cold_for(p[1])) >= policy.merge_window_s]
    if not settled:
        a, b = max(pairs, key=lambda p: min(cold_for(p[0]), cold_for(p[1])))
        held = min(cold_for(a), cold_for(b))
        return _nothing(
            Why.NOT_COLD_LONG_ENOUGH,
            f"segments {a.id} and {b.id} cold for {held:.0f} s of the "
            f"{policy.merge_window_s:g} s merge window",
        )
    if len(active) <= policy.min_segments:
        return _nothing(
            Why.MIN_SEGMENTS, f"cold segments, but {len(active)} active segments is minSegments"
        )
    last = history.last_merge_s
    if last is not None and now_s - last < policy.merge_cooldown_s:
        left = policy.merge_cooldown_s - (now_s - last)
        return _nothing(
            Why.MERGE_COOLDOWN,
            f"cold segments; last merge {_ago(last, now_s)}, next in {left:.0f} s",
        )
    shallow = [p for p in settled if max(depth[p[0].id], depth[p[1].id]) < policy.max_dag_depth]
    if not shallow:
        a, b = settled[0]
        return _nothing(
            Why.MAX_DAG_DEPTH,
            f"segments {a.id} and {b.id} are cold, but their lineage has "
            f"{policy.max_dag_depth} merges already (maxDagDepth)",
        )
    calm = [p for p in shallow if _exceeds(loads[p[0].id] + loads[p[1].id], policy.split) == 0]
    if not calm:
        return _nothing(Why.STEADY, "cold pairs, but each union would be above a split threshold")
    a, b = min(calm, key=lambda p: ((loads[p[0].id] + loads[p[1].id]).axes(), p[0].lo))
    return Decision(
        Action.MERGE,
        (a.id, b.id),
        Why.COLD,
        f"segments {a.id} and {b.id} cold for {min(cold_for(a), cold_for(b)):.0f} s "
        f"({(loads[a.id] + loads[b.id]).describe()} together)",
    )


_RATES = ("msgRateIn", "bytesRateIn", "msgRateOut", "bytesRateOut")
KNOBS: dict[str, tuple[str, ...]] = {
    "split": (*_RATES, "cooldownSeconds"),
    "merge": (*_RATES, "cooldownSeconds", "windowSeconds"),
}
"""Each section of ``spec.autoscale`` and the knobs it takes."""
TOP_KNOBS = ("enabled", "intervalSeconds", "split", "merge", "maxSegments", "minSegments",
             "maxDagDepth")  # fmt: skip
"""The keys of ``spec.autoscale`` (``enabled`` and ``intervalSeconds`` are the operator's)."""


def unknown_knobs(spec: Mapping[str, Any]) -> list[str]:
    """The keys of ``spec`` that are no knob (``split.msgRatein``: dotted for a section's),
    which :func:`policy_from` would ignore. Kubernetes prunes them from a ScalableTopic (its
    CRD lists the knobs); a policy typed by hand checks them here, since a misspelt knob
    would silently keep its default."""
    unknown = [key for key in spec if key not in TOP_KNOBS]
    for section, knobs in KNOBS.items():
        found = spec.get(section)
        if isinstance(found, Mapping):
            unknown += [f"{section}.{key}" for key in found if key not in knobs]
    return unknown


def _load(found: Mapping[str, Any], default: Load) -> Load:
    return Load(
        float(found.get("msgRateIn", default.msg_in_per_s)),
        float(found.get("bytesRateIn", default.bytes_in_per_s)),
        float(found.get("msgRateOut", default.msg_out_per_s)),
        float(found.get("bytesRateOut", default.bytes_out_per_s)),
    )


def policy_from(spec: Mapping[str, Any]) -> Policy:
    """The policy a ScalableTopic's ``spec.autoscale`` asks for (the same camelCase keys
    ``segtxn topics autoscale --policy`` takes); a knob absent keeps PIP-483's default.

    Raises:
        PolicyError: a value of the wrong type, or a policy that cannot work.
    """
    for section in ("split", "merge"):
        if not isinstance(spec.get(section) or {}, Mapping):
            raise PolicyError(
                f"autoscale: {section} is an object of thresholds (as "
                f'{{"{section}": {{"cooldownSeconds": 60}}}}), not '
                f"{type(spec[section]).__name__}"
            )
    try:
        split = dict(spec.get("split") or {})
        merge = dict(spec.get("merge") or {})
        default = Policy()
        return Policy(
            split=_load(split, default.split),
            merge=_load(merge, default.merge),
            split_cooldown_s=float(split.get("cooldownSeconds", default.split_cooldown_s)),
            merge_cooldown_s=float(merge.get("cooldownSeconds", default.merge_cooldown_s)),
            merge_window_s=float(merge.get("windowSeconds", default.merge_window_s)),
            max_segments=int(spec.get("maxSegments", default.max_segments)),
            min_segments=int(spec.get("minSegments", default.min_segments)),
            max_dag_depth=int(spec.get("maxDagDepth", default.max_dag_depth)),
        )
    except (TypeError, ValueError) as e:
        if isinstance(e, PolicyError):
            raise
        raise PolicyError(f"autoscale: {e}") from e
