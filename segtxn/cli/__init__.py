"""The ``segtxn`` command line: the composition root that wires components together.

DESIGN.md places the command line in ``segtxn/client/``; it lives here instead because
commands such as ``standalone`` and ``broker`` must import the servers, and the client
package must never import a server (an import-linter contract checks both).
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
from pathlib import Path

import click

from segtxn.cli import clients, servers, stacks, txn, verify
from segtxn.cli.demo import default_out_dir, run_demo
from segtxn.cli.operator import operator
from segtxn.client import ServerError
from segtxn.metastore import MetadataStoreError


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """segtxn: transactional streaming on scalable topics."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stacks.install()


@main.command()
@click.option(
    "--store",
    default="memory://",
    show_default=True,
    help="Metadata store URL (memory://, etcd://host:port[/ns]), or 'etcd-local' to start "
    "a private etcd server for the run.",
)
@click.option("--duration", default=60.0, show_default=True, help="Seconds of feeding inputs.")
@click.option("--rate", default=100.0, show_default=True, help="Inputs fed per second.")
@click.option("--processors", default=3, show_default=True, help="Processor processes.")
@click.option("--seed", default=None, type=int, help="Random seed (printed when chosen).")
@click.option("--master", default="local[*]", show_default=True, help="Spark master.")
@click.option(
    "--out",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where runs are recorded (default: segtxn-demo/ in the temporary directory).",
)
def demo(
    *,
    store: str,
    duration: float,
    rate: float,
    processors: int,
    seed: int | None,
    master: str,
    out: Path | None,
) -> None:
    """The main job: a transactional pipeline with splits, merges, aborts and a processor
    kill, checked end to end with Spark. Exit status 1 on any anomaly."""
    seed = seed if seed is not None else random.randrange(2**31)
    try:
        ok = asyncio.run(
            run_demo(
                store,
                duration_s=duration,
                rate=rate,
                processors=processors,
                out_dir=out or default_out_dir(),
                seed=seed,
                master=master,
            )
        )
    except (MetadataStoreError, ServerError) as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e
    sys.exit(0 if ok else 1)


main.add_command(servers.broker)
main.add_command(servers.standalone)
main.add_command(servers.coordinator)
main.add_command(clients.produce)
main.add_command(clients.consume)
main.add_command(clients.topics)
main.add_command(txn.txn)
main.add_command(verify.verify)
main.add_command(operator)
