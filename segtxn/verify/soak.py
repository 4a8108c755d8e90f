"""The soak: the verification job for many seeds back to back, each with its own drawn plan.

Run ``n`` of the soak has seed ``first_seed + n``; its plan (cluster shape, processors,
topology changes, faults) is :func:`segtxn.verify.plan.draw_plan` of that seed, so
``segtxn verify soak --seed S --runs 1`` (with the same feed options) runs seed ``S``'s plan
again. Each run is a job (:mod:`segtxn.verify.job`) in ``<out>/seed-<S>/``; all runs share one
Spark session (one JVM, its own output in ``<out>/spark.log``), started while the first run's
workload goes on. The terminal gets one line per run, then a table and the failing seeds;
``<out>/soak.json`` has the same.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from segtxn.verify.job import (
    JobResult,
    JobSettings,
    check_run,
    progress_to,
    run_job,
    run_log,
)
from segtxn.verify.plan import Shape, draw_plan

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from segtxn.verify.checker import Report


@dataclass(frozen=True)
class SoakSettings:
    job: JobSettings
    out_dir: Path
    master: str = "local[2]"
    echo_progress: bool = False
    """Every run's progress on the terminal too (``-v``), not only in its log."""
    log_level: int = logging.INFO
    """This process's log records at this level and above go to each run's
    ``logs/orchestrator.log``."""
    shape: Shape | None = None
    """Every run on this cluster shape (None: each run's is drawn from its seed)."""


async def run_soak(
    seeds: Sequence[int], settings: SoakSettings, echo: Callable[[str], None]
) -> list[JobResult]:
    from segtxn.verify.spark import prepare_environment

    settings.out_dir.mkdir(parents=True, exist_ok=True)
    prepare_environment()  # here, not in Spark's thread while this one spawns processes
    results: list[JobResult] = []
    with ThreadPoolExecutor(1, thread_name_prefix="spark") as pool:
        spark = pool.submit(
            _spark, settings.master, settings.out_dir / "spark", settings.out_dir / "spark.log"
        )
        try:
            for n, seed in enumerate(seeds, 1):
                plan = draw_plan(seed, shape=settings.shape)
                run_dir = settings.out_dir / f"seed-{seed}"
                progress = progress_to(
                    run_dir / "logs" / "orchestrator.log",
                    echo if settings.echo_progress else None,
                )
                with run_log(run_dir / "logs" / "orchestrator.log", settings.log_level):
                    result = await run_job(plan, run_dir, settings.job, _checker(spark), progress)
                results.append(result)
                echo(f"[{n}/{len(seeds)}] {result_line(result)}")
                _save(settings.out_dir, results)
        finally:
            await asyncio.to_thread(_stop, spark)
    shutil.rmtree(settings.out_dir / "spark", ignore_errors=True)  # scratch, not a record
    return results


def _spark(master: str, scratch: Path, log: Path) -> SparkSession:
    """The shared session; the JVM's stderr goes to ``log``, so the terminal keeps one line
    per run."""
    from segtxn.verify.spark import spark_session

    return spark_session(master, work_dir=scratch, log=log)


def _checker(spark: Future[SparkSession]) -> Callable[[Path, float], Report]:
    def check(run_dir: Path, run_s: float) -> Report:
        return check_run(spark.result(), run_dir, run_s)

    return check


def _stop(spark: Future[SparkSession]) -> None:
    try:
        spark.result().stop()
    except Exception:  # it never started: nothing to stop (its error was each run's)
        return


def _anomalies(result: JobResult) -> str:
    parts = [f"{kind}={n}" for kind, n in sorted(result.counts.items())]
    if result.info is not None and not result.info.drained:
        parts.append("not-drained")
    parts.extend(f"crashed:{name}" for name in sorted(result.crashed))
    if result.error is not None:
        parts.append("error")
    return " ".join(parts) or "none"


def result_line(result: JobResult) -> str:
    """One run: seed, shape, processors, faults, topology, anomalies by kind, duration."""
    plan = result.plan
    verdict = "PASS" if result.passed else "FAIL"
    line = (
        f"seed {plan.seed} {verdict} {result.duration_s:.0f}s  {plan.shape.value}  "
        f"{plan.processors} processors ({plan.processing})  faults {plan.describe_faults()}  "
        f"topology "
        f"{plan.describe_topology()}  anomalies {_anomalies(result)}"
    )
    if result.error is not None:
        line += f"  ({result.error[:300]})"
    return line


def summary_table(results: Sequence[JobResult]) -> str:
    rows = [("seed", "result", "time", "shape", "procs", "txns", "faults", "anomalies")]
    for r in results:
        faults = ", ".join(f.kind.value for f in r.plan.faults) or "none"
        rows.append(
            (
                str(r.plan.seed),
                "PASS" if r.passed else "FAIL",
                f"{r.duration_s:.0f}s",
                r.plan.shape.value,
                str(r.plan.processors),
                r.plan.processing,
                faults,
                _anomalies(r),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    )


def _save(out_dir: Path, results: Sequence[JobResult]) -> None:
    runs = [
        {
            "seed": r.plan.seed,
            "passed": r.passed,
            "duration_s": round(r.duration_s, 1),
            "shape": r.plan.shape.value,
            "processors": r.plan.processors,
            "pipelined": r.plan.pipelined,
            "faults": [f.describe() for f in r.plan.faults],
            "topology": [t.describe() for t in r.plan.topology],
            "anomalies": r.counts,
            "drained": r.info is not None and r.info.drained,
            "crashed": r.crashed,
            "error": r.error,
            "run_dir": str(r.run_dir),
        }
        for r in results
    ]
    saved = {"saved": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": runs}
    (out_dir / "soak.json").write_text(json.dumps(saved, indent=2) + "\n")
