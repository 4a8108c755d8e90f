"""The ``segtxn`` command line: the composition root that wires components together.

DESIGN.md places the command line in ``segtxn/client/``; it lives here instead because
commands such as ``standalone`` and ``broker`` must import the servers, and the client
package must never import a server (an import-linter contract checks both).
"""

from __future__ import annotations

import click

from segtxn.cli import clients, servers, stacks, txn, verbosity, verify
from segtxn.cli.demo import demo
from segtxn.cli.operator import operator


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """segtxn: transactional streaming on scalable topics."""
    verbosity.configure(verbose)
    stacks.install()


main.add_command(demo)
main.add_command(servers.broker)
main.add_command(servers.standalone)
main.add_command(servers.coordinator)
main.add_command(clients.produce)
main.add_command(clients.consume)
main.add_command(clients.topics)
main.add_command(txn.txn)
main.add_command(verify.verify)
main.add_command(operator)
