"""``segtxn produce``, ``segtxn consume`` and ``segtxn topics``: the client from a shell."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import click

from segtxn.cli.params import (
    COUNT,
    POSITIVE_INT,
    SECONDS,
    KeyHash,
    Namespace,
    Topic,
    refuse_unless,
)
from segtxn.cli.service import URL, run
from segtxn.client import Client
from segtxn.protocol.names import Domain
from segtxn.topics.model import MAX_INITIAL_SEGMENTS

SCALABLE = Topic(Domain.TOPIC)
MAX_GENERATED_BYTES = 5 * 1024 * 1024


@click.command()
@URL
@click.argument("topic", type=Topic(Domain.TOPIC, Domain.PERSISTENT))
@click.option(
    "-n", "--count", default=1, show_default=True, type=POSITIVE_INT, help="Messages to send."
)
@click.option(
    "-m", "--message", default=None, help="Payload of every message (default: generated)."
)
@click.option(
    "--size",
    default=100,
    show_default=True,
    type=click.IntRange(8, MAX_GENERATED_BYTES),
    help="Generated payload bytes (not with -m).",
)
@click.option(
    "--keys", default=0, type=COUNT, help="Use this many distinct keys (default 0: no key)."
)
@click.option("--name", default=None, help="Producer name (reuse it to keep de-duplication).")
@click.pass_context
def produce(
    ctx: click.Context,
    *,
    url: str,
    topic: str,
    count: int,
    message: str | None,
    size: int,
    keys: int,
    name: str | None,
) -> None:
    """Send COUNT messages to TOPIC and report the rate."""
    refuse_unless(ctx, "size", message is None, "-m gives the payload")

    async def body(client: Client) -> None:
        producer = await client.create_producer(topic, name=name)
        started = time.perf_counter()
        futures = []
        with click.progressbar(length=count, label="sending", file=sys.stderr) as bar:
            for i in range(count):
                payload = (
                    message.encode() if message is not None else (b"%08d" % i).ljust(size, b".")
                )
                key = f"key-{i % keys}" if keys else None
                future = await producer.send_async(payload, key=key)
                future.add_done_callback(lambda _: bar.update(1))
                futures.append(future)
            ids = await asyncio.gather(*futures)
        elapsed = time.perf_counter() - started
        click.echo(
            f"sent {count} messages in {elapsed:.2f}s ({count / elapsed:.0f} msg/s); "
            f"last id {ids[-1]}"
        )
        await producer.close()

    run(body, url)


@click.command()
@URL
@click.argument("topic", type=Topic())
@click.argument("subscription")
@click.option("-n", "--count", default=0, type=COUNT, help="Stop after this many (0: until idle).")
@click.option(
    "--type",
    "sub_type",
    default="Exclusive",
    show_default=True,
    type=click.Choice(["Exclusive", "Failover", "Shared"]),
)
@click.option(
    "--initial", default="earliest", show_default=True, type=click.Choice(["earliest", "latest"])
)
@click.option(
    "--idle-timeout", default=5.0, show_default=True, type=SECONDS, help="Stop after idle seconds."
)
@click.option("--print/--no-print", "show", default=True, help="Print each message.")
def consume(
    *,
    url: str,
    topic: str,
    subscription: str,
    count: int,
    sub_type: str,
    initial: str,
    idle_timeout: float,
    show: bool,
) -> None:
    """Receive and acknowledge messages of TOPIC on SUBSCRIPTION."""
    if not subscription.strip():
        raise click.BadParameter("a subscription needs a name", param_hint="SUBSCRIPTION")

    async def body(client: Client) -> None:
        consumer = await client.subscribe(
            topic, subscription, subscription_type=sub_type, initial_position=initial
        )
        received = 0
        while not count or received < count:
            try:
                message = await consumer.receive(timeout_s=idle_timeout)
            except TimeoutError:
                break
            if show:
                click.echo(f"{message.message_id} key={message.key} {message.value[:80]!r}")
            await consumer.acknowledge(message)
            received += 1
        click.echo(f"received {received} messages", err=True)

    run(body, url)


@click.group()
def topics() -> None:
    """Create, list, inspect and delete topics."""


def _print(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True))


@topics.command("create")
@URL
@click.argument("topic", type=Topic(Domain.TOPIC, Domain.PERSISTENT))
@click.option(
    "--segments",
    default=1,
    show_default=True,
    type=click.IntRange(1, MAX_INITIAL_SEGMENTS),
    help="Range segments (topic:// only).",
)
@click.pass_context
def create(ctx: click.Context, url: str, topic: str, segments: int) -> None:
    """Create TOPIC (persistent://t/ns/name or topic://t/ns/name)."""
    scalable = topic.startswith(f"{Domain.TOPIC.value}://")
    refuse_unless(ctx, "segments", scalable, "only a topic:// topic has segments")
    count = segments if scalable else None  # a persistent topic has none: the broker refuses one
    run(lambda c: c.admin.create_topic(topic, segments=count), url)
    click.echo(f"created {topic}")


@topics.command("list")
@URL
@click.argument("namespace", type=Namespace())
@click.option(
    "--domain", default="persistent", type=click.Choice(["persistent", "topic"]), show_default=True
)
def list_(url: str, namespace: tuple[str, str], domain: str) -> None:
    """List the topics of NAMESPACE (tenant/namespace)."""
    tenant, ns = namespace
    for name in run(lambda c: c.admin.list_topics(domain, tenant, ns), url):
        click.echo(name)


@topics.command("stats")
@URL
@click.argument("topic", type=Topic())
def stats(url: str, topic: str) -> None:
    """Print TOPIC's statistics (JSON)."""
    _print(run(lambda c: c.admin.stats(topic), url))


@topics.command("delete")
@URL
@click.argument("topic", type=Topic(Domain.TOPIC, Domain.PERSISTENT))
@click.option("--force", is_flag=True, help="Even with connected clients.")
def delete(url: str, topic: str, force: bool) -> None:
    """Delete TOPIC and its data."""
    run(lambda c: c.admin.delete_topic(topic, force=force), url)
    click.echo(f"deleted {topic}")


@topics.command("properties")
@URL
@click.argument("topic", type=Topic(Domain.TOPIC, Domain.PERSISTENT))
@click.option("--set", "assignments", multiple=True, help="KEY=VALUE (repeatable).")
@click.option("--remove", "removals", multiple=True, help="KEY (repeatable).")
def properties(
    url: str, topic: str, assignments: tuple[str, ...], removals: tuple[str, ...]
) -> None:
    """Show TOPIC's properties, after setting or removing some."""
    updates = {}
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(
                f"{assignment!r}: expected KEY=VALUE with a KEY", param_hint="'--set'"
            )
        updates[key] = value
    for key in removals:
        if not key.strip():
            raise click.BadParameter("an empty KEY", param_hint="'--remove'")

    async def body(client: Client) -> dict[str, str]:
        if updates:
            await client.admin.update_properties(topic, updates)
        for key in removals:
            await client.admin.remove_property(topic, key)
        return await client.admin.properties(topic)

    _print(run(body, url))


@topics.command("split")
@URL
@click.argument("topic", type=SCALABLE)
@click.argument("segment", type=COUNT)
@click.option(
    "--at",
    default=None,
    type=KeyHash(),
    help="Split at this key hash, 0x0001-0xffff inside the segment's range, in hex (0x...) "
    "or decimal (default: the middle of its range).",
)
def split(url: str, topic: str, segment: int, at: int | None) -> None:
    """Split SEGMENT of scalable TOPIC in two; prints the new DAG."""
    _print(run(lambda c: c.admin.split(topic, segment, at=at), url))


@topics.command("merge")
@URL
@click.argument("topic", type=SCALABLE)
@click.argument("first", type=COUNT)
@click.argument("second", type=COUNT)
def merge(url: str, topic: str, first: int, second: int) -> None:
    """Merge two adjacent active segments of scalable TOPIC; prints the new DAG."""
    if first == second:
        raise click.BadParameter("a segment cannot be merged with itself", param_hint="SECOND")
    _print(run(lambda c: c.admin.merge(topic, first, second), url))


@topics.command("subscriptions")
@URL
@click.argument("topic", type=Topic())
def subscriptions(url: str, topic: str) -> None:
    """List TOPIC's subscriptions."""
    for name in run(lambda c: c.admin.subscriptions(topic), url):
        click.echo(name)
