"""``segtxn broker`` and ``segtxn standalone``: run servers until interrupted."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import click

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.metastore import MetadataStoreError


async def _serve(servers: list[BrokerServer]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started: list[BrokerServer] = []
    try:
        for server in servers:
            await server.start()
            started.append(server)
            click.echo(
                f"broker {server.settings.broker_id} serving on "
                f"{server.settings.advertise_url} (store {server.settings.store_url}, "
                f"ledgers {server.settings.ledger_url})",
                err=True,
            )
        await stop.wait()
    finally:
        for server in reversed(started):
            await server.stop()


def _run(make: Callable[[], list[BrokerServer]]) -> None:
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(make()))
    except (MetadataStoreError, ValueError, OSError) as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e


@click.command()
@click.option("--store", required=True, help="Metadata store URL (etcd://host:port[/ns]).")
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where this broker keeps its ledgers (its topics live here).",
)
@click.option("--advertise", required=True, help="How clients reach this broker: http://host:port")
@click.option("--broker-id", default=None, help="Stable id (default: the advertised host:port).")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=None, type=int, help="Port (default: the advertised port).")
@click.option("--auto-create-topics", is_flag=True, help="Create persistent topics on first use.")
def broker(
    *,
    store: str,
    data_dir: Path,
    advertise: str,
    broker_id: str | None,
    host: str,
    port: int | None,
    auto_create_topics: bool,
) -> None:
    """Run one broker of a cluster."""
    from urllib.parse import urlsplit

    parts = urlsplit(advertise)
    broker_id = broker_id or f"{parts.hostname}-{parts.port}"
    try:
        settings = BrokerSettings(
            broker_id=broker_id,
            advertise_url=advertise,
            store_url=store,
            ledger_url=f"file://{data_dir.resolve()}",
            auto_create_topics=auto_create_topics,
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    _run(lambda: [BrokerServer(settings, host=host, port=port)])


@click.command()
@click.option(
    "--store",
    default="memory://",
    show_default=True,
    help="memory:// (nothing persists) or etcd://host:port[/ns] (with --data-dir, persists).",
)
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep ledgers here (needs an etcd store: a memory store forgets their metadata).",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int, help="0 picks a free port.")
@click.option("--auto-create-topics", is_flag=True, help="Create persistent topics on first use.")
def standalone(
    store: str, data_dir: Path | None, host: str, port: int, auto_create_topics: bool
) -> None:
    """Run a whole cluster in one process: a broker on an embedded metadata store."""
    if data_dir is not None and store.startswith("memory:"):
        raise click.UsageError(
            "--data-dir needs --store etcd://...: a memory store forgets the ledgers' "
            "metadata on restart, and segtxn never overwrites ledger files it cannot account for"
        )
    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    ledger_url = f"file://{data_dir.resolve()}" if data_dir else "memory://"
    if data_dir is None:
        click.echo("standalone: data is kept in memory and lost on exit", err=True)
    settings = BrokerSettings(
        broker_id="standalone",
        advertise_url=f"http://{host}:{port}",
        store_url=store,
        ledger_url=ledger_url,
        auto_create_topics=auto_create_topics,
    )
    _run(lambda: [BrokerServer(settings, host=host, port=port)])
