"""The ``segtxn`` group: every command wired together under :class:`segtxn.cli.errors.Main`,
which reports any failure as one line (``Error: ...``).

The process enters through :func:`segtxn.cli.main`, which imports this module where a
Ctrl-C is still one line. The commands are :class:`~segtxn.cli.lazy.Lazy`: each command's
module (and what it needs: the servers, the operator, Spark verification) is imported only
when that command runs or shows its help, so ``segtxn --help`` and a client command pay
for no other command's imports. :data:`COMMANDS` keeps each one's summary for the listing.
"""

from __future__ import annotations

from typing import Any

import click

from segtxn.cli import service, stacks, traces, verbosity
from segtxn.cli.errors import Main
from segtxn.cli.lazy import Lazy, LazyGroup

COMMANDS = {
    "broker": Lazy(
        "segtxn.cli.servers:broker", "Run one broker of a cluster until SIGTERM or SIGINT."
    ),
    "brokers": Lazy("segtxn.cli.brokers:brokers", "Inspect and drain brokers."),
    "consume": Lazy(
        "segtxn.cli.clients:consume",
        "Receive and acknowledge messages of TOPIC on SUBSCRIPTION; print how many.",
    ),
    "coordinator": Lazy(
        "segtxn.cli.servers:coordinator",
        "Run a transaction coordinator until SIGTERM or SIGINT: v5, and v4 with --data-dir or "
        "--replication (several processes share the ids; standbys take over).",
    ),
    "demo": Lazy(
        "segtxn.cli.demo:demo",
        "The main job: a transactional pipeline with splits, merges, aborts and a processor "
        "kill, checked end to end with Spark.",
    ),
    "operator": Lazy(
        "segtxn.cli.operator:operator", "Run the segtxn operator (Kopf) until SIGTERM or SIGINT."
    ),
    "produce": Lazy(
        "segtxn.cli.clients:produce", "Send COUNT messages to TOPIC and report the rate."
    ),
    "standalone": Lazy(
        "segtxn.cli.servers:standalone",
        "Run a whole cluster in one process until SIGTERM or SIGINT: a broker and a "
        "transaction coordinator on one metadata store (the embedded one by default).",
    ),
    "store": Lazy("segtxn.cli.store:store", "Maintain the metadata store."),
    "topics": Lazy("segtxn.cli.topics:topics", "Create, list, inspect and delete topics."),
    "txn": Lazy("segtxn.cli.txn:txn", "List, inspect and abort transactions."),
    "verify": Lazy(
        "segtxn.cli.verify:verify",
        "Run the transactional workload and check its guarantees with Spark.",
    ),
}
"""Every ``segtxn`` command: where it is, and its help's first sentence (tests/cli/test_lazy.py
holds each to its command's)."""


class Segtxn(Main, LazyGroup):
    """The ``segtxn`` group: :class:`Main`'s edge over lazily loaded commands."""


@click.group(
    cls=Segtxn,
    lazy=COMMANDS,
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


verbosity.accept_after_subcommands(main)
