"""The ``segtxn`` data source as a Spark stream (the Python Data Source API's
``DataSourceStreamReader``).

.. code-block:: python

    stream = (spark.readStream.format("segtxn")
              .option("url", "http://broker:8080")
              .option("topic", "topic://acme/shop/orders")
              .load())
    query = stream.writeStream.option("checkpointLocation", "ckpt/orders")...start()

Each micro-batch reads, for every segment, the entries stored since the previous one up to
the last entry the segment held when Spark asked for the latest offset: committed data
only (an aborted transaction's entries are skipped; a transaction still open in the range
holds that range's read until it ends, for at most ``timeoutS``). Offsets are per segment
(:mod:`.offsets`), written to the query's checkpoint by Spark, so a restarted query goes on
where the last committed micro-batch ended: every committed entry is in exactly one
micro-batch. A split's or merge's new segments are read from their start once their
parents are read to the end. Ranges and options as the batch source (:mod:`.source`), plus
``start``: ``earliest`` (default: everything the topic holds) or ``latest`` (what is stored
from now on), used when the query has no checkpoint yet.

``Trigger.AvailableNow`` is supported: the query reads what the topic held when it started,
in one micro-batch, and stops. The broker keeps no state for a stream (its readers hold no
cursor), so ``commit`` has nothing to release; the read limits (``maxRows`` ...) are not
supported: a query asking for one fails at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    SupportsTriggerAvailableNow,
)

from segtxn.client import Client
from segtxn.verify.offsets import SegmentView, StreamOffset, advance, at_latest, layout, ranges
from segtxn.verify.ranges import Range, read_range
from segtxn.verify.source_options import SourceOptions


class SegtxnStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = SourceOptions.parse(options)
        self.start = options.get("start", "earliest")
        if self.start not in ("earliest", "latest"):
            raise ValueError(f"segtxn source: start {self.start!r}: earliest or latest")
        self._target: list[SegmentView] | None = None
        """With Trigger.AvailableNow: the layout when the query started, the end of it."""

    def initialOffset(self) -> dict[str, Any]:
        topic = self.options.topic
        if self.start == "earliest":
            return StreamOffset(str(topic), {}).to_json()
        return at_latest(topic, self._layout()).to_json()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if not isinstance(limit, ReadAllAvailable):
            raise ValueError(f"segtxn source: read limit {limit!r} is not supported")
        views = self._target if self._target is not None else self._layout()
        return advance(StreamOffset.from_json(start, self.options.topic), views).to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._layout()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        topic = self.options.topic
        cut = ranges(
            topic,
            StreamOffset.from_json(start, topic),
            StreamOffset.from_json(end, topic),
            self.options.entries_per_range,
        )
        return [InputPartition(r) for r in cut]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        value = partition.value
        if not isinstance(value, Range):
            raise TypeError(f"segtxn source: not a range of a segment: {value!r}")
        options = self.options
        yield from asyncio.run(read_range(options.url, value, options.columns, options.timeout_s))

    def _layout(self) -> list[SegmentView]:
        return asyncio.run(self._stats())

    async def _stats(self) -> list[SegmentView]:
        async with Client(self.options.url) as client:
            return layout(self.options.topic, await client.admin.stats(str(self.options.topic)))
