"""A ScalableTopic's pure side: its topic name, the next split or merge towards
``targetSegments``, and its status from a broker's DAG answer. The handlers that call the
brokers are :mod:`.scalabletopics` and :mod:`.autoscaling`."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


def topic_of(spec: Mapping[str, Any]) -> str:
    return f"topic://{spec['tenant']}/{spec['namespace']}/{spec['topic']}"


@dataclass(frozen=True)
class Split:
    segment: int


@dataclass(frozen=True)
class Merge:
    first: int
    second: int


def next_change(segments: Sequence[Mapping[str, Any]], target: int | None) -> Split | Merge | None:
    """The next topology change towards ``target`` active segments, or None when there.

    Splitting takes the widest active segment (the lowest id on a tie) at its midpoint;
    merging takes the adjacent active pair with the narrowest union. One change at a time:
    the handler re-reads the DAG the broker answers with and asks again.
    """
    active = sorted(
        (s for s in segments if s["state"] == "ACTIVE"), key=lambda s: int(s["range"][0])
    )
    if target is None or len(active) == target or not active:
        return None

    def width(*parts: Mapping[str, Any]) -> int:
        return int(parts[-1]["range"][1]) - int(parts[0]["range"][0]) + 1

    if len(active) < target:
        widest = min(active, key=lambda s: (-width(s), int(s["id"])))
        return Split(int(widest["id"])) if width(widest) > 1 else None
    pairs = list(itertools.pairwise(active))
    first, second = min(pairs, key=lambda p: (width(*p), int(p[0]["id"])))
    return Merge(int(first["id"]), int(second["id"]))


def topic_status(dag: Mapping[str, Any], topic: str) -> Obj:
    """ScalableTopic status fields from a broker's DAG answer (split, merge or stats)."""
    segments = [
        {
            "id": int(s["id"]),
            "range": [int(s["range"][0]), int(s["range"][1])],
            "state": str(s["state"]),
            "parents": [int(p) for p in s.get("parents", [])],
            "children": [int(c) for c in s.get("children", [])],
        }
        for s in dag["segments"]
    ]
    active = sum(1 for s in segments if s["state"] == "ACTIVE")
    return {
        "topic": topic,
        "epoch": int(dag.get("epoch", 0)),
        "segments": segments,
        "activeSegments": active,
        "sealedSegments": len(segments) - active,
    }
