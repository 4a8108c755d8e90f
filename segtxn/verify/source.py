"""A PySpark data source for segtxn topics (Spark's Python Data Source API).

.. code-block:: python

    spark.dataSource.register(SegtxnDataSource)
    df = (spark.read.format("segtxn")
          .option("url", "http://broker:8080")
          .option("topic", "topic://acme/shop/orders")
          .load())

One input partition per segment of a scalable topic (sealed ones included), or one for a
``persistent://`` topic. Rows are committed messages only (READ_COMMITTED: the broker's
readers never show an aborted or undecided transaction's entries), in each segment's order.

Options:
    url: a broker's service URL, or several separated by commas (required).
    topic: ``topic://...`` or ``persistent://...`` (required).
    start: ``earliest`` (default) or ``latest``.
    end: ``latest`` (default): each segment up to the last entry it held when the read was
        planned, so the rows are one consistent cut even while producers go on. A
        transaction still open in that range holds its segment's read until it ends (or
        times out): READ_COMMITTED cannot pass an undecided entry.
    timeoutS: how long one segment's read may take (default 300) before the task fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from segtxn.client import Client, TopicEnded
from segtxn.protocol.names import Domain, TopicName

SCHEMA = (
    "topic string, segment int, ledger_id long, entry_id long, message_id string, "
    "key string, value binary, publish_time_ms long"
)
NOTHING = "-1:-1"
"""The end of a segment that held nothing when the read was planned."""


@dataclass(frozen=True)
class Segment:
    """One segment (or persistent topic) to read, from ``start`` to ``end`` inclusive: an
    input partition's value."""

    topic: str
    segment: int
    start: str
    end: str


class SegtxnDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "segtxn"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> SegtxnReader:
        return SegtxnReader(self.options)


class SegtxnReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.url = _required(options, "url")
        self.topic = TopicName.parse(_required(options, "topic"))
        self.start = options.get("start", "earliest")
        if self.start not in ("earliest", "latest"):
            raise ValueError(f"segtxn source: start {self.start!r}: earliest or latest")
        if options.get("end", "latest") != "latest":
            raise ValueError("segtxn source: end: latest (the only end supported)")
        self.timeout_s = float(options.get("timeoutS", "300"))

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(segment) for segment in asyncio.run(self._plan())]

    async def _plan(self) -> list[Segment]:
        async with Client(self.url) as client:
            stats: dict[str, Any] = await client.admin.stats(str(self.topic))
        if self.topic.domain is not Domain.TOPIC:
            return [Segment(str(self.topic), 0, self.start, _end(stats))]
        return [
            Segment(str(self.topic.segment_name(s["id"])), s["id"], self.start, _end(s["stats"]))
            for s in sorted(stats["segments"], key=lambda s: s["id"])
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        segment = partition.value
        assert isinstance(segment, Segment)
        yield from asyncio.run(self._read(segment))

    async def _read(self, partition: Segment) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        async with asyncio.timeout(self.timeout_s), Client(self.url) as client:
            reader = await client.create_reader(
                partition.topic, start=partition.start, end=partition.end
            )
            while True:
                try:
                    message = await reader.receive()
                except TopicEnded:
                    return rows
                id_ = message.message_id
                rows.append(
                    (
                        str(self.topic),
                        partition.segment,
                        id_.ledger_id,
                        id_.entry_id,
                        str(id_),
                        message.key,
                        message.value,
                        message.publish_time_ms,
                    )
                )


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name)
    if not value:
        raise ValueError(f"segtxn source: option {name!r} is required")
    return value


def _end(stats: Mapping[str, Any] | None) -> str:
    last = (stats or {}).get("lastConfirmedPosition")
    return str(last) if last else NOTHING
