"""``segtxn brokers``: what a broker holds, and handing it all to the others (a drain)."""

from __future__ import annotations

import click

from segtxn.cli.output import OUTPUT, Table, show
from segtxn.cli.params import BrokerId, FloatRange
from segtxn.cli.service import URL, run

BROKER_HOMES_LIMIT = 1000


@click.group()
def brokers() -> None:
    """Inspect and drain brokers."""


@brokers.command("homes")
@URL
@click.argument("broker", type=BrokerId())
@OUTPUT
def homes(url: str, broker: str, output: str) -> None:
    """List the topics and segments BROKER holds (it need not be alive)."""
    found = run(lambda c: c.admin.broker_homes(broker, limit=BROKER_HOMES_LIMIT), url)
    data = {
        "broker": found.broker,
        "homes": found.homes,
        "more": found.more,
        "registered": found.registered,
    }
    rows = [[home] for home in found.homes]
    empty = f"{broker} holds no topic or segment"
    if not found.registered:
        empty += f", and no broker {broker} is registered now (is the id right?)"
    show(output, data, Table(("home",), rows, empty=empty))
    if found.more:
        click.echo(f"... (more than {BROKER_HOMES_LIMIT})", err=True)


@brokers.command("drain")
@URL
@click.argument("broker", type=BrokerId())
@click.option(
    "--timeout",
    default=300.0,
    show_default=True,
    type=FloatRange(1, 3600),
    help="Seconds the drain may take.",
)
@OUTPUT
def drain(url: str, broker: str, timeout: float, output: str) -> None:
    """Hand every topic and segment BROKER holds to the other brokers (it must run with
    --replication), and place nothing new on it until `segtxn brokers undrain` or its
    restart. Exit status 1 if some stay (they are named; draining again retries them)."""
    result = run(lambda c: c.admin.drain_broker(broker, timeout_s=timeout), url)
    failed = dict(result.get("failed") or {})
    line = f"moved {len(result.get('moved') or [])} topics and segments off {broker}"
    if failed:
        stayed = "; ".join(f"{name}: {why}" for name, why in sorted(failed.items()))
        line += f"; {len(failed)} stayed: {stayed}"
    show(output, result, line)
    if failed:
        raise SystemExit(1)


@brokers.command("undrain")
@URL
@click.argument("broker", type=BrokerId())
def undrain(url: str, broker: str) -> None:
    """Let new topics be placed on BROKER again. Exit status 1 if no broker BROKER is
    registered now (a typo; or gone: it starts undrained; or its registration lost while it
    runs: it comes back still draining, undrain it then)."""
    run(lambda c: c.admin.undrain_broker(broker), url)
    click.echo(f"{broker} takes new topics again")
