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

from segtxn.cli import clients, servers
from segtxn.cli.demo import run_demo
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
@click.option("--transactions", default=200, show_default=True, help="Transactions to run.")
@click.option("--seed", default=None, type=int, help="Random seed (printed when chosen).")
def demo(store: str, transactions: int, seed: int | None) -> None:
    """Run the end-to-end demonstration and print what it saw."""
    try:
        ok = asyncio.run(run_demo(store, transactions=transactions, seed=seed))
    except MetadataStoreError as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e
    sys.exit(0 if ok else 1)


main.add_command(servers.broker)
main.add_command(servers.standalone)
main.add_command(clients.produce)
main.add_command(clients.consume)
main.add_command(clients.topics)
