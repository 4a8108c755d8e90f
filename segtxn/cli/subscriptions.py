"""``segtxn topics subscriptions | reset-subscription | delete-subscription |
repair-cursor``: a topic's subscriptions, from the command line.

Each is one call of the brokers' admin API (docs/protocol.md, "Admin"), and takes what
that call takes, no more: a reset moves a subscription to the earliest retained message,
the latest (only what is sent from then on) or, on a ``persistent://`` topic or a
``segment://``, a ``LEDGER:ENTRY``; a ``topic://`` has no position of its own (one names an
entry of one segment), so ``--to`` is a usage error there. The brokers refuse to reset or
delete a subscription while consumers are connected; that refusal is said as what to do.
``repair-cursor`` is for a cursor record that does not read (the topic is refused), where
a reset cannot load the topic; on a record that reads, its refusal names the reset.

Kept apart from :mod:`segtxn.cli.topics`, which adds these to its group.
"""

from __future__ import annotations

import click

from segtxn.cli.errors import answer_lost, describe
from segtxn.cli.output import OUTPUT, Table, show
from segtxn.cli.params import SUBSCRIPTION, LedgerEntry, Topic
from segtxn.cli.service import URL, run
from segtxn.client import ClientError, ServerError
from segtxn.protocol.errors import ConsumerBusy
from segtxn.protocol.names import Domain

ANY_TOPIC = Topic(Domain.PERSISTENT, Domain.TOPIC, Domain.SEGMENT)


@click.command("subscriptions")
@URL
@click.argument("topic", type=Topic())
@OUTPUT
def subscriptions(url: str, topic: str, output: str) -> None:
    """List TOPIC's subscriptions."""
    found = run(lambda c: c.admin.subscriptions(topic), url)
    rows = [[name] for name in found]
    show(output, found, Table(("subscription",), rows, empty=f"{topic} has no subscriptions"))


def _in_use(topic: str, subscription: str, done: str) -> str:
    """The brokers' refusal to change a subscription with consumers connected, said as
    what to do (their own words name a segment, or only the subscription)."""
    return (
        f"subscription {subscription} of {topic} has connected consumers: it cannot be "
        f"{done} while they are (close them, then run this again)"
    )


@click.command("reset-subscription")
@URL
@click.argument("topic", type=ANY_TOPIC)
@click.argument("subscription", type=SUBSCRIPTION)
@click.option(
    "--to-earliest", is_flag=True, help="From the first message TOPIC retains (all again)."
)
@click.option("--to-latest", is_flag=True, help="Only messages sent from now on.")
@click.option(
    "--to",
    "position",
    default=None,
    type=LedgerEntry(),
    help="From this message on (persistent:// or segment:// only: on a topic:// a position "
    "names one segment's entry). At most the topic's next position.",
)
@click.pass_context
def reset_subscription(
    ctx: click.Context,
    *,
    url: str,
    topic: str,
    subscription: str,
    to_earliest: bool,
    to_latest: bool,
    position: str | None,
) -> None:
    """Move SUBSCRIPTION of TOPIC: its next consumer receives from there (messages before
    it count as acknowledged, those after as not).

    Give one of --to-earliest, --to-latest or --to LEDGER:ENTRY. Refused while consumers
    are connected to it (close them first). A topic:// is moved on every segment."""
    chosen = [to_earliest, to_latest, position is not None]
    if sum(chosen) != 1:
        raise click.UsageError(
            "give one of --to-earliest, --to-latest or --to LEDGER:ENTRY (where it moves to)",
            ctx,
        )
    if position is not None and topic.startswith(f"{Domain.TOPIC.value}://"):
        raise click.UsageError(
            "--to does not apply here: a topic:// resets to --to-earliest or --to-latest (a "
            "LEDGER:ENTRY names an entry of one segment: reset that segment://.../ID instead)",
            ctx,
        )
    to = "earliest" if to_earliest else "latest" if to_latest else str(position)
    try:
        run(lambda c: c.admin.reset_subscription(topic, subscription, to), url)
    except ConsumerBusy as e:
        raise click.ClickException(_in_use(topic, subscription, "reset")) from e
    click.echo(f"reset {subscription} on {topic} to {to}")


@click.command("delete-subscription")
@URL
@click.argument("topic", type=ANY_TOPIC)
@click.argument("subscription", type=SUBSCRIPTION)
def delete_subscription(url: str, topic: str, subscription: str) -> None:
    """Delete SUBSCRIPTION of TOPIC (every segment's, for a topic://): its position and
    what it kept for open transactions; it no longer holds messages back.

    Refused while consumers are connected to it (close them first). If the answer is lost,
    it may or may not be deleted: 'segtxn topics subscriptions TOPIC' shows."""
    try:
        run(lambda c: c.admin.delete_subscription(topic, subscription), url)
    except ConsumerBusy as e:
        raise click.ClickException(_in_use(topic, subscription, "deleted")) from e
    except (ClientError, ServerError) as e:
        if not answer_lost(e):
            raise
        raise click.ClickException(
            f"the answer was lost ({describe(e)}): subscription {subscription} of {topic} "
            f"may or may not be deleted; 'segtxn topics subscriptions {topic}' shows"
        ) from e
    click.echo(f"deleted subscription {subscription} of {topic}")


@click.command("repair-cursor")
@URL
@click.argument("topic", type=Topic(Domain.PERSISTENT, Domain.SEGMENT))
@click.argument("subscription")
@click.option(
    "--to",
    default="earliest",
    show_default=True,
    metavar="earliest|LEDGER:ENTRY",
    help="Where the subscription starts again: its first retained message, or this one.",
)
@OUTPUT
def repair_cursor(url: str, topic: str, subscription: str, to: str, output: str) -> None:
    """Rewrite SUBSCRIPTION's cursor record when it does not read (TOPIC is refused with
    PersistenceError naming it; for a topic:// give the segment:// the error names).

    The subscription restarts at the first message TOPIC retains (every retained message
    is delivered again: none is lost), or --to. Refused when the record reads (use
    reset-subscription), or changed meanwhile (nothing written); docs/ledger.md."""
    found = run(lambda c: c.admin.repair_cursor(topic, subscription, to=to), url)
    line = (
        f"repaired {subscription} on {topic}: it starts again at {found['start']} "
        f"(the record at {found['key']} did not read)"
    )
    show(output, found, line)


COMMANDS = (subscriptions, reset_subscription, delete_subscription, repair_cursor)
"""What :mod:`segtxn.cli.topics` adds to its group."""
