"""``segtxn verify run|check|stream|process``: the verification workload and its Spark checker
(``verify soak`` is in :mod:`segtxn.cli.soak`, imported only when it is used: the
processes a soak starts run ``verify run`` and need none of it)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from segtxn.cli import verbosity
from segtxn.cli.lazy import Lazy, LazyGroup
from segtxn.cli.params import (
    FRACTION,
    POSITIVE_INT,
    SECONDS,
    SERVICE_URLS,
    FloatRange,
    history_option,
)
from segtxn.cli.service import URL_ENV, check_reachable, connection_failure
from segtxn.client import TopicAlreadyExists
from segtxn.verify.history import HistoryStore
from segtxn.verify.processor import ProcessorConfig, Topics, run_processor
from segtxn.verify.workload import WorkloadConfig, run_workload

if TYPE_CHECKING:
    from segtxn.verify.checker import Report

RUN_DIR = click.Path(file_okay=False, path_type=Path)


RUN_URL = click.option(
    "--url",
    required=True,
    envvar=URL_ENV,
    show_envvar=True,
    type=SERVICE_URLS,
    help="A broker's service URL, http://host:port, or several separated by commas.",
)
"""``--url`` of the commands that run against a cluster: required (no default broker)."""


SOAK = Lazy(
    "segtxn.cli.soak:soak",
    "Run the verification job for many seeds, each with a cluster shape and faults drawn from "
    "its seed; exit status 1 naming the failing seeds.",
)


@click.group(cls=LazyGroup, lazy={"soak": SOAK})
def verify() -> None:
    """Run the transactional workload and check its guarantees with Spark."""


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}")


def _run_name(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    if not RUN_NAME.fullmatch(value):
        raise click.BadParameter(
            f"{value!r}: 1-128 of A-Z a-z 0-9 _ . = - (it names the run's topics)"
        )
    return value


def _check_new_run_dir(value: Path) -> None:
    """A run directory that holds no run yet: a second run's histories would be mixed into
    the first's, and the checker would read both as one. (Checked when the command runs,
    not when its flags parse: rendered commands are parsed where the directory is not.)"""
    history = value / "history"
    if (value / "run.json").exists() or (history.is_dir() and any(history.iterdir())):
        raise click.BadParameter(
            f"{value} already holds a recorded run: give a new directory",
            param_hint="'--run-dir'",
        )


def _check_recorded_run_dir(value: Path) -> None:
    if not (value / "run.json").is_file():
        raise click.BadParameter(
            f"{value} holds no recorded run (no run.json): record one with segtxn verify run",
            param_hint="'--run-dir'",
        )


def _raise_unreachable(e: Exception, url: str) -> None:
    failure = connection_failure(e, url)
    if failure is not None:
        raise failure from e


@verify.command()
@RUN_URL
@click.option(
    "--run-dir",
    required=True,
    type=RUN_DIR,
    help="Where the run is recorded (a new directory).",
)
@click.option(
    "--run",
    default="run",
    show_default=True,
    callback=_run_name,
    help="Run name: names the topics (topic://verify/RUN/...), new on the cluster.",
)
@click.option(
    "--inputs", default=5000, show_default=True, type=POSITIVE_INT, help="Inputs to feed."
)
@click.option(
    "--keys", default=50, show_default=True, type=POSITIVE_INT, help="Distinct input keys."
)
@click.option(
    "--rate",
    default=100.0,
    show_default=True,
    type=FloatRange(min=0.1, max=100_000),
    help="Inputs fed per second.",
)
@click.option(
    "--processors",
    default=3,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Processor processes.",
)
@click.option(
    "--abort-rate",
    default=0.1,
    show_default=True,
    type=FRACTION,
    help="Share of transactions aborted on purpose.",
)
@click.option(
    "--timeout-rate",
    default=0.02,
    show_default=True,
    type=FRACTION,
    help="Share of transactions stalled past their timeout.",
)
@click.option(
    "--seed",
    default=None,
    type=click.IntRange(min=0),
    help="Random seed (printed when chosen).",
)
@click.option("--no-topology", is_flag=True, help="No splits or merges during the run.")
@click.option("--no-kill", is_flag=True, help="Kill no processor during the run.")
@history_option(HistoryStore.TOPICS)
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
    history: str,
) -> None:
    """Feed, process (in transactions), split, merge and kill; record every client's history."""
    _check_new_run_dir(run_dir)
    if abort_rate + timeout_rate > 1:
        raise click.BadParameter(
            "--abort-rate and --timeout-rate add up to more than 1", param_hint="'--timeout-rate'"
        )
    seed = seed if seed is not None else random.randrange(2**31)
    config = WorkloadConfig(
        url=url, run_dir=run_dir, run=run, inputs=inputs, keys=keys, rate=rate,
        processors=processors, abort_rate=abort_rate, timeout_rate=timeout_rate, seed=seed,
        launch=verbosity.child_launch(), history=HistoryStore(history),
    )  # fmt: skip
    if no_topology:
        config = dataclasses.replace(config, changes=())
    if no_kill:
        config = dataclasses.replace(config, faults=())
    try:
        asyncio.run(check_reachable(url))
        click.echo(f"workload {run} against {url}, seed {seed}, recorded in {run_dir}")
        info = asyncio.run(run_workload(config, click.echo))
    except TopicAlreadyExists as e:
        raise click.ClickException(
            f"run {run!r} was run on this cluster before ({e.message}): give --run a new name"
        ) from e
    except Exception as e:
        _raise_unreachable(e, url)
        raise
    click.echo(f"fed {info.fed:,} inputs; drained: {info.drained}; left {len(info.leftover)}")
    sys.exit(0 if info.drained else 1)


@verify.command()
@click.option(
    "--run-dir",
    default=None,
    type=RUN_DIR,
    help="A run recorded by `verify run` (its run.json says where its histories are). "
    "Without it, --url and --run name a run recorded in topics.",
)
@click.option(
    "--url",
    default=None,
    type=SERVICE_URLS,
    help="A broker's URL, or several separated by commas (default: the run's).",
)
@click.option(
    "--run",
    "run_name",
    default=None,
    callback=lambda ctx, param, value: value and _run_name(ctx, param, value),
    help="Without --run-dir: the run's name (its topics, its history topic included).",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master.")
@click.option(
    "--html",
    "html_path",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the HTML report here, and its screenshot beside it (.png) when a headless "
    "Chromium is at hand.",
)
@click.option(
    "--report-configmap",
    default=None,
    help="In a VerificationRun's driver pod: also write the verdict and reports into this "
    "ConfigMap (needs --html; docs/kubernetes.md).",
)
def check(
    *,
    run_dir: Path | None,
    url: str | None,
    run_name: str | None,
    master: str,
    html_path: Path | None,
    report_configmap: str | None,
) -> None:
    """Check a recorded run with Spark; exit status 1 when any anomaly is found."""
    if report_configmap is not None and html_path is None:
        raise click.UsageError("--report-configmap needs --html")
    if run_dir is not None:
        _check_recorded_run_dir(run_dir)
    elif url is None or run_name is None:
        raise click.UsageError("give --run-dir, or --url and --run for a run recorded in topics")
    from segtxn.verify.checker import check as check_frames
    from segtxn.verify.checker import load, load_topics
    from segtxn.verify.history import HistoryError
    from segtxn.verify.report import screenshot, summary, write_html
    from segtxn.verify.report.model import verdict
    from segtxn.verify.spark import require_java, spark_session

    try:
        require_java()
    except RuntimeError as e:
        raise click.ClickException(str(e)) from e
    spark = spark_session(master)
    try:
        if run_dir is not None:
            frames = load(spark, run_dir, url)
        else:
            assert url is not None and run_name is not None  # checked above
            frames = load_topics(spark, url, run_name)
        report = check_frames(frames)
    except HistoryError as e:  # (RunNotRecorded too): nothing can be concluded
        raise click.ClickException(str(e)) from e
    finally:
        spark.stop()
    info = frames.info
    assert info is not None  # loaded from a run
    run_s = info.ended - info.started
    passed = verdict(report, info).passed
    click.echo(summary(report, run_s, info))
    if html_path is not None:
        write_html(report, run_s, html_path, info)
        click.echo(f"report: {html_path}")
        try:
            screenshot.take(html_path, html_path.with_suffix(".png"))
            click.echo(f"its screenshot: {html_path.with_suffix('.png')}")
        except screenshot.ScreenshotError as e:
            click.echo(f"no screenshot of it: {e}")
        if report_configmap is not None:
            text = summary(report, run_s, info)
            _publish(report_configmap, report, info.drained, text, html_path, passed=passed)
    sys.exit(0 if passed else 1)


def _publish(
    name: str, report: Report, drained: bool, summary: str, html_path: Path, *, passed: bool
) -> None:
    from segtxn.verify.publish import PublishError, publish_report

    try:
        publish_report(name, report, drained, summary, html_path, passed=passed)
    except PublishError as e:
        raise click.ClickException(f"the report was not published: {e}") from e
    click.echo(f"report published: ConfigMap {name}")


@verify.command()
@RUN_URL
@click.option("--run", required=True, callback=_run_name, help="The run's name (its topics).")
@click.option("--run-dir", required=True, type=RUN_DIR, help="The run's directory (histories).")
@click.option(
    "--checkpoint",
    default=None,
    type=RUN_DIR,
    help="Where Spark keeps the query's offsets (a restarted check reads on from them).  "
    "[default: RUN_DIR/stream-ckpt]",
)
@click.option("--trigger", default=1.0, show_default=True, type=SECONDS, help="Seconds per batch.")
@click.option(
    "--window",
    default=1000,
    show_default=True,
    type=POSITIVE_INT,
    help="Inputs per key remembered to find a duplicate output (an older copy shows up as an "
    "order violation).",
)
@click.option("--for", "duration", default=None, type=SECONDS, help="Stop after this long.")
@click.option(
    "--wait",
    default=60.0,
    show_default=True,
    type=SECONDS,
    help="How long to wait for the run's topics to exist.",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master.")
@history_option(HistoryStore.TOPICS)
def stream(
    *,
    url: str,
    run: str,
    run_dir: Path,
    checkpoint: Path | None,
    trigger: float,
    window: int,
    duration: float | None,
    wait: float,
    master: str,
    history: str,
) -> None:
    """Check a run's topics while it runs (a line per Spark micro-batch) until it ends;
    exit status 1 when any anomaly is found."""
    from pyspark.errors import StreamingQueryException

    from segtxn.verify.processor import Topics
    from segtxn.verify.spark import require_java, spark_session
    from segtxn.verify.stream_job import (
        StreamSettings,
        TopicsMissing,
        follow_run,
        summary,
        wait_for_topics,
    )

    try:
        require_java()
        asyncio.run(check_reachable(url))
        asyncio.run(wait_for_topics(url, Topics.for_run(run), wait, HistoryStore(history)))
    except (RuntimeError, TopicsMissing) as e:
        raise click.ClickException(str(e)) from e
    settings = StreamSettings(
        url, run, run_dir, checkpoint or run_dir / "stream-ckpt", trigger, window, duration,
        HistoryStore(history),
    )  # fmt: skip
    spark = spark_session(master)
    try:
        online = follow_run(spark, settings, click.echo)
    except StreamingQueryException as e:
        raise click.ClickException(str(e)) from e
    finally:
        spark.stop()
    click.echo(summary(online))
    sys.exit(0 if online.anomalies == 0 else 1)


@verify.command(hidden=True)
@click.option("--url", required=True, type=SERVICE_URLS)
@click.option("--run-dir", required=True, type=RUN_DIR)
@click.option("--run", required=True, callback=_run_name)
@click.option("--name", required=True)
@click.option("--seed", required=True, type=click.IntRange(min=0))
@click.option("--batch", default=20, type=POSITIVE_INT)
@click.option("--abort-rate", default=0.1, type=FRACTION)
@click.option("--timeout-rate", default=0.02, type=FRACTION)
@click.option("--txn-timeout", default=3.0, type=SECONDS)
@click.option("--pipelined", is_flag=True, help="end each transaction while the next is worked on")
@history_option(HistoryStore.FILES)
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
    pipelined: bool,
    history: str,
) -> None:
    """One processor of a run (started by `verify run`)."""
    config = ProcessorConfig(
        url=url, run_dir=run_dir, topics=Topics.for_run(run), name=name, seed=seed, batch=batch,
        abort_rate=abort_rate, timeout_rate=timeout_rate, txn_timeout_s=txn_timeout,
        history=HistoryStore(history), pipelined=pipelined,
    )  # fmt: skip
    started = time.monotonic()
    asyncio.run(run_processor(config))
    click.echo(f"processor {name} stopped after {time.monotonic() - started:.1f} s")
