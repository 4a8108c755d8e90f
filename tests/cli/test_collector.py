"""Server processes collect the youngest generation less often than CPython's default
(:func:`segtxn.cli.lifecycle.collect_young_less_often`)."""

from __future__ import annotations

import gc
from typing import Any

from segtxn.cli import lifecycle


class _Cell:
    """Two container objects the collector tracks (the instance and its list)."""

    def __init__(self) -> None:
        self.items: list[Any] = []


def _young_collections_while_allocating(count: int) -> int:
    collections = 0

    def counted(phase: str, info: dict[str, Any]) -> None:
        nonlocal collections
        if phase == "start" and info["generation"] == 0:
            collections += 1

    gc.collect()  # start from an empty young generation
    kept = []
    gc.callbacks.append(counted)
    try:
        for _ in range(count):
            kept.append(_Cell())  # alive: each counts towards the next collection
    finally:
        gc.callbacks.remove(counted)
    return collections


def test_the_young_generation_is_collected_every_10000_allocations() -> None:
    before = gc.get_threshold()
    try:
        assert _young_collections_while_allocating(2_000) >= 5  # the default: every 700
        lifecycle.collect_young_less_often()
        assert gc.get_threshold() == (lifecycle.YOUNG_COLLECTION_EVERY, *before[1:])
        assert _young_collections_while_allocating(2_000) == 0  # 4,000 objects
        assert _young_collections_while_allocating(12_000) >= 2
    finally:
        gc.set_threshold(*before)
