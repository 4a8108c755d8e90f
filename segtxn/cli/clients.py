"""``segtxn produce``, ``segtxn consume`` and ``segtxn topics``: the client from a shell."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from segtxn.client import Client, ServerError, Timeout

T = TypeVar("T")

URL = click.option(
    "--url",
    default="http://127.0.0.1:8080",
    show_default=True,
    envvar="SEGTXN_URL",
    help="Any broker of the cluster.",
)


def run(body: Callable[[Client], Awaitable[T]], url: str) -> T:
    """Run ``body`` with a client of ``url``; server errors become clean CLI errors."""

    async def main() -> T:
        async with Client(url) as client:
            return await body(client)

    try:
        return asyncio.run(main())
    except ServerError as e:
        raise click.ClickException(f"{e.name.value}: {e.message}") from e
    except Timeout as e:
        raise click.ClickException(f"Timeout: {e}") from e


@click.command()
@URL
@click.argument("topic")
@click.option("-n", "--count", default=1, show_default=True, help="Messages to send.")
@click.option("-m", "--message", default=None, help="Payload (default: generated).")
@click.option("--size", default=100, show_default=True, help="Generated payload bytes.")
@click.option("--keys", default=0, help="Use this many distinct keys (0: no key).")
@click.option("--name", default=None, help="Producer name (reuse it to keep de-duplication).")
def produce(
    *, url: str, topic: str, count: int, message: str | None, size: int, keys: int, name: str | None
) -> None:
    """Send COUNT messages to TOPIC and report the rate."""

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
            f"last id {ids[-1] if ids else None}"
        )
        await producer.close()

    run(body, url)


@click.command()
@URL
@click.argument("topic")
@click.argument("subscription")
@click.option("-n", "--count", default=0, help="Stop after this many (0: until idle).")
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
@click.option("--idle-timeout", default=5.0, show_default=True, help="Stop after idle seconds.")
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
@click.argument("topic")
@click.option(
    "--segments", type=int, default=None, help="Range segments of a topic:// (default 1)."
)
def create(url: str, topic: str, segments: int | None) -> None:
    """Create TOPIC (persistent://t/ns/name or topic://t/ns/name)."""
    run(lambda c: c.admin.create_topic(topic, segments=segments), url)
    click.echo(f"created {topic}")


@topics.command("list")
@URL
@click.argument("namespace")
@click.option(
    "--domain", default="persistent", type=click.Choice(["persistent", "topic"]), show_default=True
)
def list_(url: str, namespace: str, domain: str) -> None:
    """List the topics of NAMESPACE (tenant/namespace)."""
    tenant, _, ns = namespace.partition("/")
    if not ns:
        raise click.UsageError("NAMESPACE is tenant/namespace")
    for name in run(lambda c: c.admin.list_topics(domain, tenant, ns), url):
        click.echo(name)


@topics.command("stats")
@URL
@click.argument("topic")
def stats(url: str, topic: str) -> None:
    """Print TOPIC's statistics (JSON)."""
    _print(run(lambda c: c.admin.stats(topic), url))


@topics.command("delete")
@URL
@click.argument("topic")
@click.option("--force", is_flag=True, help="Even with connected clients.")
def delete(url: str, topic: str, force: bool) -> None:
    """Delete TOPIC and its data."""
    run(lambda c: c.admin.delete_topic(topic, force=force), url)
    click.echo(f"deleted {topic}")


@topics.command("properties")
@URL
@click.argument("topic")
@click.option("--set", "assignments", multiple=True, help="KEY=VALUE (repeatable).")
@click.option("--remove", "removals", multiple=True, help="KEY (repeatable).")
def properties(
    url: str, topic: str, assignments: tuple[str, ...], removals: tuple[str, ...]
) -> None:
    """Show TOPIC's properties, after setting or removing some."""
    updates = {}
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep:
            raise click.UsageError(f"--set {assignment!r}: expected KEY=VALUE")
        updates[key] = value

    async def body(client: Client) -> dict[str, str]:
        if updates:
            await client.admin.update_properties(topic, updates)
        for key in removals:
            await client.admin.remove_property(topic, key)
        return await client.admin.properties(topic)

    _print(run(body, url))


@topics.command("split")
@URL
@click.argument("topic")
@click.argument("segment", type=int)
@click.option("--at", default=None, help="Split hash (0x... or decimal; default: midpoint).")
def split(url: str, topic: str, segment: int, at: str | None) -> None:
    """Split SEGMENT of scalable TOPIC in two; prints the new DAG."""
    point = int(at, 0) if at is not None else None
    _print(run(lambda c: c.admin.split(topic, segment, at=point), url))


@topics.command("merge")
@URL
@click.argument("topic")
@click.argument("first", type=int)
@click.argument("second", type=int)
def merge(url: str, topic: str, first: int, second: int) -> None:
    """Merge two adjacent active segments of scalable TOPIC; prints the new DAG."""
    _print(run(lambda c: c.admin.merge(topic, first, second), url))


@topics.command("subscriptions")
@URL
@click.argument("topic")
def subscriptions(url: str, topic: str) -> None:
    """List TOPIC's subscriptions."""
    for name in run(lambda c: c.admin.subscriptions(topic), url):
        click.echo(name)
