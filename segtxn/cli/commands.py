"""The ``segtxn`` group: every command wired together under :class:`segtxn.cli.errors.Main`,
which reports any failure as one line (``Error: ...``).

The process enters through :func:`segtxn.cli.main`, which imports this module (and so
every command's dependencies) where a Ctrl-C is still one line.
"""

from __future__ import annotations

from typing import Any

import click

from segtxn.cli import (
    brokers,
    clients,
    servers,
    service,
    soak,
    stacks,
    store,
    topics,
    traces,
    txn,
    verbosity,
    verify,
)
from segtxn.cli.demo import demo
from segtxn.cli.errors import Main
from segtxn.cli.operator import operator


@click.group(
    cls=Main,
    epilog="Exit status: 0 done (a server: stopped by SIGTERM or SIGINT), 1 failed, "
    "2 bad usage, 130 interrupted (SIGINT), 143 terminated (SIGTERM). Errors are one line on "
    "stderr; -vv adds tracebacks.",
)
@click.option(
    "-v", "--verbose", count=True, help="More logging (-v info, -vv debug; also after COMMAND)."
)
@service.credential_options
@click.version_option(package_name="segtxn", message="segtxn %(version)s")
@click.pass_context
def main(ctx: click.Context, /, verbose: int, **credentials: Any) -> None:
    """segtxn: transactional streaming on scalable topics."""
    token_file = credentials.pop("token_file")
    if token_file is not None:
        if credentials["token"] is not None:
            raise click.UsageError("give --token or --token-file, not both")
        credentials["token"] = token_file  # a Path: the client reads it, again on change
    ctx.meta[service.CREDENTIALS_KEY] = credentials  # for the clients the commands make
    verbosity.configure(verbose)
    traces.start(ctx.invoked_subcommand)  # OTEL_*: off unless they ask (docs/tracing.md)
    stacks.install()


main.add_command(demo)
main.add_command(servers.broker)
main.add_command(servers.standalone)
main.add_command(servers.coordinator)
main.add_command(clients.produce)
main.add_command(clients.consume)
main.add_command(topics.topics)
main.add_command(brokers.brokers)
main.add_command(txn.txn)
main.add_command(verify.verify)
verify.verify.add_command(soak.soak)
main.add_command(operator)
main.add_command(store.store)
verbosity.accept_after_subcommands(main)
