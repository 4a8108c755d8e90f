"""A PySpark data source for segtxn topics (Spark's Python Data Source API), batch and
streaming.

.. code-block:: python

    spark.dataSource.register(SegtxnDataSource)
    df = (spark.read.format("segtxn")
          .option("url", "http://broker:8080")
          .option("topic", "topic://acme/shop/orders")
          .load())
    stream = spark.readStream.format("segtxn").option(...).load()  # see .stream_source

Every segment of a scalable topic (sealed ones included), or the one ledger of a
``persistent://`` topic, is read in ranges of its entries (:mod:`.ranges`): one input
partition per earlier ledger and per ``rangeEntries`` entries of its last one, so a small
segment is one partition and a big one many. Rows are committed messages only
(READ_COMMITTED: the broker's readers never show an aborted or undecided transaction's
entries), in each segment's order.

Options (:class:`.source_options.SourceOptions`):
    url: a broker's service URL, or several separated by commas (required).
    topic: ``topic://...`` or ``persistent://...`` (required).
    start: ``earliest`` (default) or ``latest`` (batch only).
    end: ``latest`` (default): each segment up to the last entry it held when the read was
        planned, so the rows are one consistent cut even while producers go on. A
        transaction still open in that range holds its range's read until it ends (or
        times out): READ_COMMITTED cannot pass an undecided entry.
    timeoutS: how long one range's read may take (default 300) before its task fails with
        :class:`.ranges.SegmentReadTimeout`.
    rangeEntries: entries per range of a segment's last ledger (default 100000).
    columns: the columns to return, separated by commas (default: all). The Python Data
        Source API hands a reader the full schema, never the columns a query uses, so
        pruning is this option: without ``value`` no payload crosses into Spark.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from segtxn.client import Client
from segtxn.protocol.names import Domain
from segtxn.verify.ranges import FIRST, NOTHING, Range, parse_position, read_range, schema_of, split
from segtxn.verify.source_options import SourceOptions
from segtxn.verify.stream_source import SegtxnStreamReader


class SegtxnDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "segtxn"

    def schema(self) -> str:
        return schema_of(SourceOptions.parse(self.options).columns)

    def reader(self, schema: StructType) -> SegtxnReader:
        return SegtxnReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SegtxnStreamReader(self.options)


class SegtxnReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = SourceOptions.parse(options)
        self.start = options.get("start", "earliest")
        if self.start not in ("earliest", "latest"):
            raise ValueError(f"segtxn source: start {self.start!r}: earliest or latest")
        if options.get("end", "latest") != "latest":
            raise ValueError("segtxn source: end: latest (the only end supported)")

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(r) for r in asyncio.run(self._plan())]

    async def _plan(self) -> list[Range]:
        topic = self.options.topic
        async with Client(self.options.url) as client:
            stats: dict[str, Any] = await client.admin.stats(str(topic))
        if topic.domain is not Domain.TOPIC:
            return self._ranges(str(topic), 0, stats)
        return [
            r
            for s in sorted(stats["segments"], key=lambda s: s["id"])
            for r in self._ranges(str(topic.segment_name(s["id"])), s["id"], s["stats"])
        ]

    def _ranges(self, name: str, segment: int, stats: Mapping[str, Any] | None) -> list[Range]:
        """The segment up to its last entry now, in ranges; one range that reads nothing
        when it holds nothing (or ``start`` is ``latest``: the end is already behind it)."""
        last = (stats or {}).get("lastConfirmedPosition")
        read_as = str(self.options.topic)
        if not last or self.start == "latest":
            return [Range(name, segment, self.start, str(last or NOTHING), read_as)]
        cut = split(FIRST, parse_position(str(last)), self.options.entries_per_range)
        return [Range(name, segment, f"{a[0]}:{a[1]}", f"{b[0]}:{b[1]}", read_as) for a, b in cut]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        value = partition.value
        if not isinstance(value, Range):
            raise TypeError(f"segtxn source: not a range of a segment: {value!r}")
        options = self.options
        yield from asyncio.run(read_range(options.url, value, options.columns, options.timeout_s))
