"""One verification run, start to end: a cluster, the workload with its faults, the check.

``segtxn demo`` runs one job with the fixed demo plan; the soak (:mod:`segtxn.verify.soak`)
runs one per seed with a drawn plan. A job starts the cluster of the plan's shape
(:mod:`segtxn.verify.cluster`), runs the workload (:mod:`segtxn.verify.workload`) with the
plan's topology changes and faults, checks the run with Spark while the cluster still serves
its topics, and stops the cluster. The run directory keeps everything: ``history/`` (when the
histories are kept in files, else they are in the run's history topic),
``logs/`` (every process, every incarnation, and ``orchestrator.log``: this process's own
log and progress), ``run.json``, ``report.txt``, ``report.html`` and ``report.png`` (its
screenshot).
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from segtxn.verify.cluster import open_cluster
from segtxn.verify.history import HistoryStore
from segtxn.verify.plan import RunPlan
from segtxn.verify.processes import Launch
from segtxn.verify.workload import RunInfo, WorkloadConfig, run_workload

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from segtxn.verify.checker import Report


@dataclass(frozen=True)
class JobSettings:
    inputs: int
    rate: float
    """Inputs fed per second."""
    launch: Launch
    store: str | None = None
    """For ``cluster-etcd``: an etcd URL to use instead of a private etcd."""
    drain_timeout_s: float = 120.0
    history: HistoryStore = HistoryStore.FILES
    """Where the run's clients record their histories."""


@dataclass
class JobResult:
    plan: RunPlan
    run_dir: Path
    info: RunInfo | None
    report: Report | None
    duration_s: float
    crashed: dict[str, list[int]]
    """Processes (processors, servers) that exited by themselves: their exit codes."""
    error: str | None = None
    """What stopped the job before its verdict (a server that did not come back, ...)."""

    @property
    def counts(self) -> dict[str, int]:
        return {} if self.report is None else {k: v for k, v in self.report.counts.items() if v}

    @property
    def passed(self) -> bool:
        drained = self.info is not None and self.info.drained
        clean = self.report is not None and not self.counts and not self.crashed
        return self.error is None and drained and clean


Checker = Callable[[Path, float], "Report"]
"""Checks the run in a directory (and its run time): blocking, run in a thread."""


async def run_job(
    plan: RunPlan,
    run_dir: Path,
    settings: JobSettings,
    checker: Checker,
    progress: Callable[[str], None],
) -> JobResult:
    """Run ``plan`` in ``run_dir``. A failure of the harness's own making (a server that does
    not come back, a workload error) ends the job with ``error`` set, not an exception."""
    started = time.monotonic()
    info = report = None
    crashed: dict[str, list[int]] = {}
    try:
        async with open_cluster(
            plan.shape, run_dir, launch=settings.launch, store=settings.store, echo=progress
        ) as cluster:
            config = WorkloadConfig(
                url=cluster.url,
                run_dir=run_dir,
                run=run_dir.name,
                inputs=settings.inputs,
                rate=settings.rate,
                processors=plan.processors,
                seed=plan.seed,
                changes=plan.topology,
                faults=plan.faults,
                pipelined=plan.pipelined,
                drain_timeout_s=settings.drain_timeout_s,
                launch=settings.launch,
                history=settings.history,
            )
            progress(
                f"workload: {config.inputs:,} inputs over {config.keys} keys at "
                f"{config.rate:g}/s, {plan.processors} processors ({plan.processing}), aborts "
                f"{config.abort_rate:.0%}, stalls past the timeout {config.timeout_rate:.0%}, "
                f"seed {plan.seed}; topology {plan.describe_topology()}; faults "
                f"{plan.describe_faults()}; recorded in {run_dir}"
            )
            info = await run_workload(config, progress, cluster)
            if not info.drained:
                progress(
                    f"the processors did not consume every input in {config.drain_timeout_s} s"
                    " (their stacks, and the servers', are in their logs)"
                )
            # Spark's driver calls block, and the data source runs its own event loops
            report = await asyncio.to_thread(checker, run_dir, info.ended - info.started)
            crashed = {**info.crashed, **cluster.crashed()}
            if crashed:
                progress(f"processes that exited by themselves (exit codes): {crashed}")
    except Exception as e:  # the job's verdict: reported with the run, never lost
        progress(f"run failed: {traceback.format_exc()}")
        return JobResult(plan, run_dir, info, report, time.monotonic() - started, crashed, repr(e))
    return JobResult(plan, run_dir, info, report, time.monotonic() - started, crashed)


def check_run(spark: SparkSession, run_dir: Path, run_s: float) -> Report:
    """Check the run in ``run_dir`` with ``spark``; write ``report.txt``, ``report.html``
    and (with a headless Chromium at hand) ``report.png`` next to it."""
    from segtxn.verify.checker import check, load
    from segtxn.verify.report import write_report

    try:
        report = check(load(spark, run_dir))
    finally:
        spark.catalog.clearCache()  # one session checks many runs: free this one's frames
    write_report(report, run_s, run_dir, RunInfo.load(run_dir))
    return report


@contextmanager
def run_log(path: Path, level: int) -> Iterator[None]:
    """This process's log records at ``level`` and above also go to ``path`` for the run;
    the terminal keeps the level it had."""
    root = logging.getLogger()
    handler = logging.FileHandler(path)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for existing in root.handlers:
        if existing.level == logging.NOTSET:
            existing.setLevel(root.level)
    before = root.level
    root.setLevel(min(before, level))
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(before)
        handler.close()


def progress_to(path: Path, echo: Callable[[str], None] | None) -> Callable[[str], None]:
    """A progress callback that appends to ``path`` (and echoes, if ``echo``)."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def progress(line: str) -> None:
        with open(path, "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        if echo is not None:
            echo(line)

    return progress
