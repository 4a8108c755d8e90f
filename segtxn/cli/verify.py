"""``segtxn verify run|check|process``: the verification workload and its Spark checker."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys
import time
from pathlib import Path

import click

from segtxn.cli import verbosity
from segtxn.verify.processor import ProcessorConfig, Topics, run_processor
from segtxn.verify.workload import RunInfo, WorkloadConfig, run_workload

RUN_DIR = click.Path(file_okay=False, path_type=Path)


@click.group()
def verify() -> None:
    """Run the transactional workload and check its guarantees with Spark."""


@verify.command()
@click.option("--url", required=True, help="A broker's service URL.")
@click.option("--run-dir", required=True, type=RUN_DIR, help="Where the run is recorded.")
@click.option("--run", default="run", show_default=True, help="Run name (names the topics).")
@click.option("--inputs", default=5000, show_default=True, help="Inputs to feed.")
@click.option("--keys", default=50, show_default=True, help="Distinct input keys.")
@click.option("--rate", default=100.0, show_default=True, help="Inputs fed per second.")
@click.option("--processors", default=3, show_default=True, help="Processor processes.")
@click.option("--abort-rate", default=0.1, show_default=True, help="Transactions aborted.")
@click.option("--timeout-rate", default=0.02, show_default=True, help="Transactions stalled.")
@click.option("--seed", default=None, type=int, help="Random seed (printed when chosen).")
@click.option("--no-topology", is_flag=True, help="No splits or merges during the run.")
@click.option("--no-kill", is_flag=True, help="Kill no processor during the run.")
def run(
    *,
    url: str,
    run_dir: Path,
    run: str,
    inputs: int,
    keys: int,
    rate: float,
    processors: int,
    abort_rate: float,
    timeout_rate: float,
    seed: int | None,
    no_topology: bool,
    no_kill: bool,
) -> None:
    """Feed, process (in transactions), split, merge and kill; record every client's history."""
    seed = seed if seed is not None else random.randrange(2**31)
    config = WorkloadConfig(
        url=url, run_dir=run_dir, run=run, inputs=inputs, keys=keys, rate=rate,
        processors=processors, abort_rate=abort_rate, timeout_rate=timeout_rate, seed=seed,
        launch=verbosity.child_launch(),
    )  # fmt: skip
    if no_topology:
        config = dataclasses.replace(config, changes=())
    if no_kill:
        config = dataclasses.replace(config, faults=())
    click.echo(f"workload {run} against {url}, seed {seed}, recorded in {run_dir}")
    info = asyncio.run(run_workload(config, click.echo))
    click.echo(f"fed {info.fed:,} inputs; drained: {info.drained}; left {len(info.leftover)}")
    sys.exit(0 if info.drained else 1)


@verify.command()
@click.option("--run-dir", required=True, type=RUN_DIR, help="A run recorded by `verify run`.")
@click.option("--url", default=None, help="A broker's URL (default: the one the run used).")
@click.option("--master", default="local[*]", show_default=True, help="Spark master.")
@click.option("--html", "html_path", default=None, type=click.Path(path_type=Path))
def check(run_dir: Path, url: str | None, master: str, html_path: Path | None) -> None:
    """Check a recorded run with Spark; exit status 1 when any anomaly is found."""
    from segtxn.verify.checker import check as check_frames
    from segtxn.verify.checker import load
    from segtxn.verify.report import summary, write_html
    from segtxn.verify.spark import spark_session

    info = RunInfo.load(run_dir)
    spark = spark_session(master)
    try:
        report = check_frames(load(spark, run_dir, url))
    finally:
        spark.stop()
    run_s = info.ended - info.started
    click.echo(summary(report, run_s))
    if html_path is not None:
        write_html(report, run_s, html_path)
        click.echo(f"report: {html_path}")
    sys.exit(0 if report.anomalies == 0 and info.drained else 1)


@verify.command(hidden=True)
@click.option("--url", required=True)
@click.option("--run-dir", required=True, type=RUN_DIR)
@click.option("--run", required=True)
@click.option("--name", required=True)
@click.option("--seed", required=True, type=int)
@click.option("--batch", default=20)
@click.option("--abort-rate", default=0.1)
@click.option("--timeout-rate", default=0.02)
@click.option("--txn-timeout", default=3.0)
def process(
    *,
    url: str,
    run_dir: Path,
    run: str,
    name: str,
    seed: int,
    batch: int,
    abort_rate: float,
    timeout_rate: float,
    txn_timeout: float,
) -> None:
    """One processor of a run (started by `verify run`)."""
    config = ProcessorConfig(
        url=url, run_dir=run_dir, topics=Topics.for_run(run), name=name, seed=seed, batch=batch,
        abort_rate=abort_rate, timeout_rate=timeout_rate, txn_timeout_s=txn_timeout,
    )  # fmt: skip
    started = time.monotonic()
    asyncio.run(run_processor(config))
    click.echo(f"processor {name} stopped after {time.monotonic() - started:.1f} s")
