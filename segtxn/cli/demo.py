"""``segtxn demo``: the main job. Start a cluster, run the transactional workload with splits,
merges, aborts, timeouts and a processor kill, then prove the guarantees with Spark.

On ``memory://`` (the default) the cluster is one ``segtxn standalone`` process on the
embedded store. On etcd (``etcd://host:port[/ns]``, or ``etcd-local`` for a private etcd
started for the run) it is two brokers and a transaction coordinator, each its own process.
The job (:mod:`segtxn.verify.job`) starts the cluster (:mod:`segtxn.verify.cluster`), runs the
workload with the fixed demo plan (:func:`segtxn.verify.plan.demo_plan`) and checks the run.
The text report goes to the terminal, an HTML report with plots next to the run's files; the
exit status is non-zero on any anomaly. Every process logs into ``<run dir>/logs/`` (at INFO;
``-vv``: DEBUG).
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from segtxn.cli import verbosity
from segtxn.cli.params import FloatRange, StoreUrl, history_option
from segtxn.cli.servers import STORE_TIMEOUT_S
from segtxn.cli.traces import child_env, trace_option
from segtxn.metastore import MetadataStoreError, open_store, wait_reachable
from segtxn.verify.history import HistoryStore
from segtxn.verify.job import JobSettings, check_run, progress_to, run_job, run_log
from segtxn.verify.plan import Shape, demo_plan

if TYPE_CHECKING:
    from segtxn.verify.checker import Report

LOCAL_ETCD = "etcd-local"
NO_SCREENSHOT = "no screenshot of it (needs playwright and a chromium; see docs/verification.md)"


@click.command()
@click.option(
    "--store",
    default="memory://",
    show_default=True,
    type=StoreUrl(LOCAL_ETCD),
    help="Metadata store URL (memory://, etcd://host:port[/ns]), or 'etcd-local' to start "
    "a private etcd server for the run.",
)
@click.option(
    "--duration",
    default=60.0,
    show_default=True,
    type=FloatRange(min=1, max=24 * 3600),
    help="Seconds of feeding inputs.",
)
@click.option(
    "--rate",
    default=100.0,
    show_default=True,
    type=FloatRange(min=1, max=100_000),
    help="Inputs fed per second.",
)
@click.option(
    "--processors",
    default=3,
    show_default=True,
    type=click.IntRange(min=1, max=64),
    help="Processor processes.",
)
@click.option(
    "--seed", default=None, type=click.IntRange(min=0), help="Random seed (printed when chosen)."
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master.")
@click.option(
    "--out",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where runs are recorded (default: segtxn-demo/ in the temporary directory).",
)
@trace_option
@history_option(HistoryStore.FILES)
def demo(
    *,
    store: str,
    duration: float,
    rate: float,
    processors: int,
    seed: int | None,
    master: str,
    out: Path | None,
    trace: bool,
    history: str,
) -> None:
    """The main job: a transactional pipeline with splits, merges, aborts and a processor
    kill, checked end to end with Spark. Exit status 1 on any anomaly. --trace: every
    process prints spans (one transaction in twenty) into its log in the run's logs/."""
    seed = seed if seed is not None else random.randrange(2**31)
    external = None
    if store == "memory://":
        shape = Shape.STANDALONE_MEMORY
    else:
        shape = Shape.CLUSTER_ETCD
        if store != LOCAL_ETCD:
            asyncio.run(_check_store(store))
            external = store
    run = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{seed}"
    run_dir = (out or default_out_dir()) / run
    settings = JobSettings(
        inputs=max(1, int(duration * rate)),
        rate=rate,
        launch=verbosity.child_launch(child_env(trace)),
        store=external,
        history=HistoryStore(history),
    )
    logs = run_dir / "logs"
    progress = progress_to(logs / "orchestrator.log", click.echo)

    def checker(run_dir: Path, run_s: float) -> Report:
        from segtxn.verify.report import summary
        from segtxn.verify.spark import spark_session
        from segtxn.verify.workload import RunInfo

        progress(f"checking with Spark ({master}) ...")
        spark = spark_session(master, work_dir=run_dir / "spark", log=logs / "spark.log")
        try:
            report = check_run(spark, run_dir, run_s)
        finally:
            spark.stop()
        click.echo(summary(report, run_s, RunInfo.load(run_dir)))
        click.echo(f"HTML report: {run_dir / 'report.html'}")
        png = run_dir / "report.png"
        click.echo(f"its screenshot: {png}" if png.exists() else NO_SCREENSHOT)
        return report

    plan = demo_plan(seed, shape, processors)
    logs.mkdir(parents=True, exist_ok=True)
    with run_log(logs / "orchestrator.log", verbosity.file_level()):
        result = asyncio.run(run_job(plan, run_dir, settings, checker, progress))
    if result.error is not None:
        click.echo(f"the run failed: {result.error} (logs in {logs})", err=True)
    sys.exit(0 if result.passed else 1)


async def _check_store(store: str) -> None:
    """Fail early, before starting anything, on a store that does not answer."""
    opened = open_store(store)
    try:
        await wait_reachable(opened, timeout_s=STORE_TIMEOUT_S, url=store)
    except MetadataStoreError as e:
        raise click.ClickException(f"metadata store {store}: {e}") from e
    finally:
        await opened.close()


def default_out_dir() -> Path:
    return Path(tempfile.gettempdir()) / "segtxn-demo"
