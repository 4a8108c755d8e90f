"""The ``segtxn`` command line: the composition root that wires components together.

DESIGN.md places the command line in ``segtxn/client/``; it lives here instead because
commands such as ``standalone`` and ``broker`` must import the servers, and the client
package must never import a server (an import-linter contract checks both).
"""

from __future__ import annotations

import asyncio
import logging
import sys

import click

from segtxn.cli import clients, servers, txn
from segtxn.cli.demo import run_demo
from segtxn.client import ServerError
from segtxn.metastore import MetadataStoreError


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """segtxn: transactional streaming on scalable topics."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.option(
    "--store",
    default="memory://",
    show_default=True,
    help="Metadata store URL (memory://, etcd://host:port[/ns]), or 'etcd-local' to start "
    "a private etcd server for the run.",
)
@click.option("--messages", default=20_000, show_default=True, help="Messages to stream.")
@click.option("--keys", default=200, show_default=True, help="Distinct keys.")
@click.option("--segments", default=4, show_default=True, help="Range segments of the topic.")
@click.option("--seed", default=None, type=int, help="Random seed (printed when chosen).")
def demo(store: str, messages: int, keys: int, segments: int, seed: int | None) -> None:
    """Stream keyed messages through a scalable topic on segtxn standalone, and check them."""
    try:
        ok = asyncio.run(
            run_demo(store, messages=messages, keys=keys, segments=segments, seed=seed)
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
