"""``segtxn verify soak``: many seeded runs of the verification workload, each with its own
faults and topology changes, checked by Spark (docs/verification.md, "Soak")."""

from __future__ import annotations

import asyncio
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import click

from segtxn.cli import verbosity
from segtxn.cli.params import FloatRange, history_option
from segtxn.cli.verify import RUN_DIR
from segtxn.verify.history import HistoryStore
from segtxn.verify.job import JobSettings
from segtxn.verify.plan import Shape
from segtxn.verify.processes import TEST_BUGS_ENV
from segtxn.verify.soak import SoakSettings, run_soak, summary_table

DRAIN_TIMEOUT_S = 120.0
BUG_NAME = re.compile(r"[A-Za-z0-9_.,-]{1,100}")


def _check_new_soak_dirs(out: Path, seeds: list[int]) -> None:
    """A soak's seed directories must be new: an earlier soak's histories would be mixed
    into the new run's (the checker reads both as one run and reports anomalies that never
    happened), and its brokers would find ledger files their fresh metadata does not know."""
    taken = [
        s for s in seeds if (out / f"seed-{s}").is_dir() and any((out / f"seed-{s}").iterdir())
    ]
    if taken:
        more = f" (and {len(taken) - 1} more of these seeds)" if len(taken) > 1 else ""
        raise click.BadParameter(
            f"{out} already holds seed-{taken[0]}{more} from an earlier soak: give a new "
            "directory, or other seeds",
            param_hint="'--out'",
        )


def _bug_name(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not BUG_NAME.fullmatch(value):
        raise click.BadParameter("letters, digits and _ . , - only (e.g. fence-race)")
    return value


@click.command()
@click.option(
    "--runs", default=10, show_default=True, type=click.IntRange(min=1), help="Runs (seeds)."
)
@click.option(
    "--seed",
    default=None,
    type=click.IntRange(min=0, max=2**62),
    help="The first run's seed (default: random, printed); run n has seed+n-1. "
    "--seed S --runs 1 runs seed S's plan again.",
)
@click.option(
    "--duration",
    default=25.0,
    show_default=True,
    type=FloatRange(min=1, max=3600),
    help="Seconds of feed per run.",
)
@click.option(
    "--rate",
    default=100.0,
    show_default=True,
    type=FloatRange(min=1, max=100_000),
    help="Inputs fed per second.",
)
@click.option(
    "--out",
    default=None,
    type=RUN_DIR,
    help="Where the runs are kept, one seed-S directory each; seeds an earlier soak left "
    "there are refused (default: segtxn-soak/<time> in the temporary directory).",
)
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
@click.option(
    "--drain-timeout",
    default=DRAIN_TIMEOUT_S,
    show_default=True,
    type=FloatRange(min=1),
    help="Seconds a run may take to consume every input after the feed.",
)
@click.option(
    "--shape",
    default=None,
    type=click.Choice([s.value for s in Shape]),
    help="Run every seed on this cluster shape (default: drawn from each seed, like the "
    "rest of its plan).",
)
@click.option(
    "--inject-bug",
    default=None,
    callback=_bug_name,
    help=f"Set {TEST_BUGS_ENV}=NAME for every server and processor: the product "
    "re-introduces that known race, to prove the soak can fail.",
)
@history_option(HistoryStore.FILES)
def soak(
    *,
    runs: int,
    seed: int | None,
    duration: float,
    rate: float,
    out: Path | None,
    master: str,
    drain_timeout: float,
    shape: str | None,
    inject_bug: str | None,
    history: str,
) -> None:
    """Run the verification job for many seeds, each with a cluster shape and faults drawn
    from its seed; exit status 1 naming the failing seeds."""
    from segtxn.verify.spark import require_java

    first = seed if seed is not None else random.randrange(2**31)
    seeds = list(range(first, first + runs))
    out = out or Path(tempfile.gettempdir()) / "segtxn-soak" / time.strftime("%Y%m%d-%H%M%S")
    _check_new_soak_dirs(out, seeds)
    try:
        require_java()
    except RuntimeError as e:
        raise click.ClickException(str(e)) from e
    env = {TEST_BUGS_ENV: inject_bug} if inject_bug else {}
    settings = SoakSettings(
        job=JobSettings(
            inputs=max(1, int(duration * rate)),
            rate=rate,
            launch=verbosity.child_launch(env),
            drain_timeout_s=drain_timeout,
            history=HistoryStore(history),
        ),
        out_dir=out,
        master=master,
        echo_progress=verbosity.verbosity() > 0,
        log_level=verbosity.file_level(),
        shape=Shape(shape) if shape else None,
    )
    bug = f", {TEST_BUGS_ENV}={inject_bug}" if inject_bug else ""
    click.echo(
        f"soak: {runs} run(s), seeds {first}..{seeds[-1]}, {duration:g} s of feed at "
        f"{rate:g}/s{bug}; runs kept in {out}"
    )
    results = asyncio.run(run_soak(seeds, settings, click.echo))
    click.echo("")
    click.echo(summary_table(results))
    failed = [r.plan.seed for r in results if not r.passed]
    click.echo(f"runs kept in {out} (one directory per seed: history, logs, report)")
    if not failed:
        click.echo(f"PASS: {len(results)} run(s), no anomaly")
        return
    again = f"segtxn verify soak --runs 1 --duration {duration:g} --rate {rate:g}"
    if drain_timeout != DRAIN_TIMEOUT_S:
        again += f" --drain-timeout {drain_timeout:g}"
    if inject_bug:
        again += f" --inject-bug {inject_bug}"
    if shape:
        again += f" --shape {shape}"
    if history != HistoryStore.FILES.value:
        again += f" --history {history}"
    click.echo(f"FAIL: {len(failed)} of {len(results)} run(s): seeds {', '.join(map(str, failed))}")
    click.echo(f"reproduce one: {again} --seed {failed[0]}")
    sys.exit(1)
