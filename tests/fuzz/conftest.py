"""Shared pieces of the fuzzing tests: the server log, the tally of cases, guarded data.

Every fuzzing test runs against real in-process servers and checks, for every case: no 5xx,
the documented error shape, and nothing at ERROR (or with a traceback) in the server log; and
after all its cases: the servers still serve, and data produced before the fuzzing reads back
unchanged.

Knobs (environment):

- ``SEGTXN_FUZZ_SCALE=N``: N times as many examples (default 1: a few seconds per test, for
  ``make test``; ``SEGTXN_FUZZ_SCALE=20`` is a long run of several minutes).
- ``SEGTXN_FUZZ_SURVEY=FILE``: do not stop at the first violation; record every distinct
  one (per class) and write them to FILE as JSON (how the failures in the closing note of
  issue 15 were counted).

At the end of a run pytest prints the cases tried per class (and violations, when surveying):
see :mod:`tests.fuzz.tally`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from segtxn.client import Client, TopicEnded
from segtxn.coordinator.app import V4
from tests.cluster import Cluster
from tests.waiting import wait_until

SCALE = max(1, int(os.environ.get("SEGTXN_FUZZ_SCALE", "1")))


def examples(n: int) -> int:
    """``n`` examples, times SEGTXN_FUZZ_SCALE."""
    return n * SCALE


class ServerLog(logging.Handler):
    """Records at WARNING and above from every logger (the servers run in this process)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self._seen = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def new_problems(self) -> list[tuple[str, str]]:
        """ERROR records and tracebacks since the last call: (signature, the record)."""
        fresh = self.records[self._seen :]
        self._seen = len(self.records)
        out = []
        for record in fresh:
            if record.levelno >= logging.ERROR or record.exc_info:
                kind = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
                text = re.sub(r"[0-9a-f]{12}|\d+", "N", record.getMessage())[:100]
                full = logging.Formatter().format(record)
                out.append((f"log {record.levelname} {record.name} {kind}: {text}", full))
        return out


@pytest.fixture
def server_log() -> Iterator[ServerLog]:
    handler = ServerLog()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


# ---------------------------------------------------------------------- guarded data

GUARD_TENANT = "guard"
"""Fuzzed requests never name this tenant: its data must read back unchanged."""
GUARDED = ("persistent://guard/data/plain", "topic://guard/data/scalable")


@dataclass
class Guarded:
    messages: dict[str, list[tuple[bytes, str | None, dict[str, str]]]]


async def _read_all(client: Client, topic: str) -> list[Any]:
    """Every message stored on a persistent topic, or on the two segments of a scalable one."""
    if topic.startswith("topic://"):
        ledgers = [topic.replace("topic://", "segment://") + f"/{i}" for i in (0, 1)]
    else:
        ledgers = [topic]
    out = []
    for ledger in ledgers:
        reader = await client.create_reader(ledger, start="earliest", end="latest")
        try:
            while True:
                try:
                    out.append(await reader.receive(timeout_s=10))
                except TopicEnded:
                    break
        finally:
            await reader.close()
    return out


@pytest.fixture
async def guarded(cluster: Cluster) -> AsyncIterator[Guarded]:
    """Messages stored before the fuzzing; after it, they read back unchanged."""
    v4 = cluster.coordinator.app[V4]  # fully started: stopping it half-way leaks its logs
    await wait_until(lambda: len(v4.held) == v4.settings.v4_coordinator_ids, what="v4 ids")
    sent: dict[str, list[tuple[bytes, str | None, dict[str, str]]]] = {}
    async with Client(cluster.url) as client:
        for topic in GUARDED:
            if topic.startswith("topic://"):
                await client.admin.create_topic(topic, segments=2)
            else:
                await client.admin.create_topic(topic)
            producer = await client.create_producer(topic, name="guard")
            sent[topic] = []
            for i in range(20):
                message = (f"guarded {i}".encode(), f"k{i % 5}", {"i": str(i)})
                await producer.send(message[0], key=message[1], properties=message[2])
                sent[topic].append(message)
            await producer.close()
    yield Guarded(sent)
    async with Client(cluster.url) as client:
        for topic, messages in sent.items():
            got = await _read_all(client, topic)
            back = sorted((m.value, m.key, dict(m.properties)) for m in got)
            assert back == sorted(messages), f"{topic}: the guarded data changed"
