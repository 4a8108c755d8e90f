"""``segtxn verify stream``: the continuous check (:mod:`.stream_check`) beside a running
workload, from when its topics exist until the run ends.

Once the run's three topics exist (:func:`wait_for_topics`), the job runs the streaming
check (a line per micro-batch) and stops once the run has ended (its ``run.json`` is
written) or its time is up; then one last micro-batch reads what the topics hold by then
(Trigger.AvailableNow on the same checkpoint), so every record the run left is checked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from segtxn.client import Client, ServerError
from segtxn.protocol.errors import ErrorName
from segtxn.verify.history import HistoryStore
from segtxn.verify.processor import Topics
from segtxn.verify.stream_check import (
    ONLINE,
    BatchReport,
    OnlineCheck,
    Outcomes,
    run_frame,
    start_check,
)


class TopicsMissing(Exception):
    """The run's topics did not all exist in time: no run of that name on that cluster
    (yet). The message names the missing ones."""


@dataclass(frozen=True)
class StreamSettings:
    url: str
    run: str
    run_dir: Path
    """Where the run records its histories (``history/``) and, at its end, ``run.json``."""
    checkpoint: Path
    trigger_s: float = 1.0
    window: int = 1000
    """Outputs per key kept for the duplicate check."""
    duration_s: float | None = None
    """Stop after this long even if the run goes on (None: when it ends)."""
    history: HistoryStore = HistoryStore.FILES
    """Where the run records its histories: ``history/`` in ``run_dir``, or its history
    topic (then read as a fourth stream of the query)."""


async def wait_for_topics(
    url: str, topics: Topics, timeout_s: float, history: HistoryStore = HistoryStore.FILES
) -> None:
    """Return once every topic of the run exists (its history topic too, with ``history``
    topics).

    Raises:
        TopicsMissing: some still do not after ``timeout_s``.
    """
    names = [topics.input, topics.out_a, topics.out_b]
    if history is HistoryStore.TOPICS:
        names.append(topics.history)
    deadline = time.monotonic() + timeout_s
    async with Client(url) as client:
        while True:
            missing = []
            for name in names:
                try:
                    await client.admin.stats(name)
                except ServerError as e:
                    if e.name is not ErrorName.TOPIC_NOT_FOUND:
                        raise
                    missing.append(name)
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise TopicsMissing(
                    f"{', '.join(missing)}: not on {url} after {timeout_s:g} s (is run "
                    f"{topics.input.split('/')[-2]!r} started, on this cluster?)"
                )
            await asyncio.sleep(0.5)  # sleep-ok: the poll interval of a bounded wait


def follow_run(
    spark: SparkSession, settings: StreamSettings, echo: Callable[[str], object]
) -> OnlineCheck:
    """Check the run as it goes (see the module docstring); the check's counts and samples.
    The run's topics must exist (:func:`wait_for_topics`).

    Raises:
        pyspark StreamingQueryException: the query failed (a range not read in time, a
            broker that went away): its message says why.
    """
    topics = Topics.for_run(settings.run)
    in_topic = settings.history is HistoryStore.TOPICS
    outcomes = Outcomes(None if in_topic else settings.run_dir / "history")
    check = OnlineCheck(outcomes, window=settings.window)
    frame = run_frame(spark, settings.url, topics, history=in_topic)

    def report(batch: BatchReport) -> None:
        echo(batch.line())

    query = start_check(frame, check, settings.checkpoint, report, trigger_s=settings.trigger_s)
    ends = None if settings.duration_s is None else time.monotonic() + settings.duration_s
    try:
        while not (settings.run_dir / "run.json").exists():
            if query.awaitTermination(1) or (ends is not None and time.monotonic() >= ends):
                break
    finally:
        query.stop()
    last = start_check(frame, check, settings.checkpoint, report, trigger_s=None)
    last.awaitTermination()
    return check


def summary(check: OnlineCheck) -> str:
    lines = ["online check:"]
    for kind, description in ONLINE.items():
        lines.append(f"  {kind:<16} {check.counts[kind]:>6}   {description}")
        lines += [f"      e.g. {sample}" for sample in check.samples[kind]]
    lines.append(
        f"  transactions whose outcome no history gave: {check.pending} still waiting, "
        f"{check.undecided} given up (the batch check decides them)"
    )
    return "\n".join(lines)
