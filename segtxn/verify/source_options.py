"""The ``segtxn`` data source's options, parsed once where Spark hands them over (the batch
reader and the stream reader share them): a bad option fails the query's planning with a
message naming it, not a task later."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from segtxn.protocol.names import TopicName
from segtxn.verify.ranges import (
    DEFAULT_ENTRIES_PER_RANGE,
    DEFAULT_TIMEOUT_S,
    column_names,
)


@dataclass(frozen=True)
class SourceOptions:
    """``url`` (one broker URL or several separated by commas) and ``topic`` are required;
    ``timeout_s`` bounds the read of one range (``timeoutS``), ``entries_per_range`` cuts a
    segment's last ledger into ranges (``rangeEntries``), ``columns`` are the columns the rows
    carry (``columns``, default all)."""

    url: str
    topic: TopicName
    timeout_s: float
    entries_per_range: int
    columns: tuple[str, ...]

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SourceOptions:
        """Raises ValueError naming the option that is missing or wrong."""
        return cls(
            url=required(options, "url"),
            topic=TopicName.parse(required(options, "topic")),
            timeout_s=_number(options, "timeoutS", DEFAULT_TIMEOUT_S),
            entries_per_range=int(_number(options, "rangeEntries", DEFAULT_ENTRIES_PER_RANGE)),
            columns=column_names(options.get("columns")),
        )


def required(options: Mapping[str, Any], name: str) -> str:
    value = options.get(name)
    if not value:
        raise ValueError(f"segtxn source: option {name!r} is required")
    return str(value)


def _number(options: Mapping[str, Any], name: str, default: float) -> float:
    text = options.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or (name == "rangeEntries" and value % 1):
        raise ValueError(f"segtxn source: option {name!r}: {text!r} is not a positive number")
    return value
