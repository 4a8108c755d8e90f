"""``segtxn broker``, ``segtxn coordinator`` and ``segtxn standalone``: run until interrupted."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import click

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.coordinator.app import CoordinatorServer
from segtxn.coordinator.v5 import CoordinatorSettings
from segtxn.ledger import RetentionPolicy
from segtxn.ledger.retention import DEFAULT_RETENTION_TIME_S, NO_LIMIT, check_limit
from segtxn.metastore import MetadataStoreError

Server = BrokerServer | CoordinatorServer
F = TypeVar("F", bound=Callable[..., None])


def _describe(server: Server) -> str:
    if isinstance(server, BrokerServer):
        s = server.settings
        where = f"store {s.store_url}, ledgers {s.ledger_url}"
        return f"broker {s.broker_id} on {s.advertise_url} ({where})"
    return f"transaction coordinator on {server.settings.advertise_url}"


async def _serve(servers: list[Server]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started: list[Server] = []
    try:
        for server in servers:
            await server.start()
            started.append(server)
            click.echo(f"serving: {_describe(server)}", err=True)
        await stop.wait()
    finally:
        for server in reversed(started):
            await server.stop()


def _run(make: Callable[[], list[Server]]) -> None:
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(make()))
    except (MetadataStoreError, ValueError, OSError) as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e


def _test_bugs() -> frozenset[str]:
    """``SEGTXN_TEST_BUGS`` (comma-separated): known bugs put back on purpose, so that the
    soak harness can show it catches them. Tests only."""
    return frozenset(
        b.strip() for b in os.environ.get("SEGTXN_TEST_BUGS", "").split(",") if b.strip()
    )


def _free(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _limit(_: click.Context, param: click.Parameter, value: float) -> float:
    try:
        check_limit(param.name or "value", value)
    except ValueError:
        raise click.BadParameter(f"must be -1 (no limit) or >= 0, not {value}") from None
    return value


def _retention_options(command: F) -> F:
    """``--retention-time`` and ``--retention-size``: the broker-wide retention policy."""
    size = click.option(
        "--retention-size",
        default=NO_LIMIT,
        show_default=True,
        type=int,
        callback=_limit,
        metavar="BYTES",
        help="Also delete a consumed ledger once the consumed data newer than it reaches "
        "this many bytes (-1: no size limit).",
    )
    time = click.option(
        "--retention-time",
        default=DEFAULT_RETENTION_TIME_S,
        show_default=True,
        type=float,
        callback=_limit,
        metavar="SECONDS",
        help="Delete a ledger every subscription has consumed once it closed this long ago "
        "(-1: no time limit; 0: once consumed). Without subscriptions, keep data this long "
        "(0 or -1: forever). Unconsumed data is never deleted.",
    )
    return time(size(command))


def _retention(retention_time: float, retention_size: int) -> RetentionPolicy:
    return RetentionPolicy(retention_time_s=retention_time, retention_bytes=retention_size)


@click.command()
@click.option("--store", required=True, help="Metadata store URL (etcd://host:port[/ns]).")
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where this broker keeps its ledgers (its topics live here).",
)
@click.option("--advertise", required=True, help="How clients reach this broker: http://host:port")
@click.option("--broker-id", default=None, help="Stable id (default: the advertised host-port).")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=None, type=int, help="Port (default: the advertised port).")
@click.option("--auto-create-topics", is_flag=True, help="Create persistent topics on first use.")
@click.option("--session-ttl", default=10.0, show_default=True, help="Lease TTL.")
@click.option(
    "--consumer-hold",
    default=10.0,
    show_default=True,
    help="Seconds a dropped Failover member keeps its segments (0: they move at once).",
)
@_retention_options
def broker(
    *,
    session_ttl: float,
    consumer_hold: float,
    retention_time: float,
    retention_size: int,
    store: str,
    data_dir: Path,
    advertise: str,
    broker_id: str | None,
    host: str,
    port: int | None,
    auto_create_topics: bool,
) -> None:
    """Run one broker of a cluster."""
    parts = urlsplit(advertise)
    try:
        settings = BrokerSettings(
            broker_id=broker_id or f"{parts.hostname}-{parts.port}",
            advertise_url=advertise,
            store_url=store,
            ledger_url=f"file://{data_dir.resolve()}",
            auto_create_topics=auto_create_topics,
            session_ttl_s=session_ttl,
            consumer_hold_s=consumer_hold,
            test_bugs=_test_bugs(),
            retention=_retention(retention_time, retention_size),
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    _run(lambda: [BrokerServer(settings, host=host, port=port)])


@click.command()
@click.option("--store", required=True, help="Metadata store URL (etcd://host:port[/ns]).")
@click.option("--advertise", required=True, help="How clients reach it: http://host:port")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=None, type=int, help="Port (default: the advertised port).")
@click.option("--ids", default=4, show_default=True, help="Number of v5 coordinator ids.")
@click.option("--gc-retention", default=60.0, show_default=True, help="Seconds before header GC.")
@click.option("--gc-sweep", default=10.0, show_default=True, help="Seconds between GC sweeps.")
@click.option(
    "--default-timeout", default=60.0, show_default=True, help="Transaction timeout if none asked."
)
@click.option(
    "--timeout-sweep", default=1.0, show_default=True, help="Seconds between timeout sweeps."
)
@click.option("--session-ttl", default=10.0, show_default=True, help="Lease TTL (take-over time).")
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep v4 transaction logs here; enables v4 transactions (persistent:// topics). "
    "Whoever may take a v4 id over must see the same directory.",
)
@click.option(
    "--v4-ids", default=2, show_default=True, help="v4 coordinator ids (with --data-dir)."
)
def coordinator(
    *,
    store: str,
    advertise: str,
    host: str,
    port: int | None,
    ids: int,
    gc_retention: float,
    gc_sweep: float,
    default_timeout: float,
    timeout_sweep: float,
    session_ttl: float,
    data_dir: Path | None,
    v4_ids: int,
) -> None:
    """Run a transaction coordinator: v5, and v4 with --data-dir (several processes share
    the ids; standbys take over)."""
    settings = CoordinatorSettings(
        advertise_url=advertise,
        store_url=store,
        coordinator_ids=ids,
        gc_retention_s=gc_retention,
        gc_sweep_s=gc_sweep,
        default_timeout_s=default_timeout,
        timeout_sweep_s=timeout_sweep,
        session_ttl_s=session_ttl,
        v4_coordinator_ids=v4_ids if data_dir is not None else 0,
        ledger_url=f"file://{data_dir.resolve()}" if data_dir is not None else "memory://",
    )
    _run(lambda: [CoordinatorServer(settings, host=host, port=port)])


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
@click.option(
    "--coordinator-port", default=None, type=int, help="Coordinator port (default: a free one)."
)
@click.option("--auto-create-topics", is_flag=True, help="Create persistent topics on first use.")
@_retention_options
def standalone(
    *,
    store: str,
    data_dir: Path | None,
    host: str,
    port: int,
    coordinator_port: int | None,
    auto_create_topics: bool,
    retention_time: float,
    retention_size: int,
) -> None:
    """Run a whole cluster in one process: a broker and a transaction coordinator on one
    metadata store (the embedded one by default)."""
    if data_dir is not None and store.startswith("memory:"):
        raise click.UsageError(
            "--data-dir needs --store etcd://...: a memory store forgets the ledgers' "
            "metadata on restart, and segtxn never overwrites ledger files it cannot account for"
        )
    port = port or _free(host)
    coordinator_port = coordinator_port or _free(host)
    ledger_url = f"file://{data_dir.resolve()}" if data_dir else "memory://"
    if data_dir is None:
        click.echo("standalone: data is kept in memory and lost on exit", err=True)
    try:
        broker_settings = BrokerSettings(
            broker_id="standalone",
            advertise_url=f"http://{host}:{port}",
            store_url=store,
            ledger_url=ledger_url,
            auto_create_topics=auto_create_topics,
            test_bugs=_test_bugs(),
            retention=_retention(retention_time, retention_size),
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    coordinator_settings = CoordinatorSettings(
        advertise_url=f"http://{host}:{coordinator_port}",
        store_url=store,
        v4_coordinator_ids=2,
        ledger_url=f"file://{(data_dir / 'txn-log').resolve()}" if data_dir else "memory://",
    )

    def servers() -> list[Server]:
        node = BrokerServer(broker_settings, host=host, port=port)
        # one process, one store: a memory:// URL opened twice would be two unrelated stores
        txn = CoordinatorServer(
            coordinator_settings, host=host, port=coordinator_port, store=node.service.store
        )
        return [node, txn]

    _run(servers)
