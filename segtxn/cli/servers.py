"""``segtxn broker``, ``segtxn coordinator`` and ``segtxn standalone``: run until SIGTERM or
SIGINT (:mod:`segtxn.cli.lifecycle`: a start-up that fails fast, a bounded shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click

from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.broker.txn.headers import HeaderWatch
from segtxn.cli import lifecycle
from segtxn.cli.datadir import claim_data_dir
from segtxn.cli.httpflags import ACCESS_LOG, connection_options
from segtxn.cli.listening import listen_as_advertised, listen_on_a_free_port, url_of
from segtxn.cli.logs import log_format_option, say
from segtxn.cli.loops import EventLoop, event_loop_option
from segtxn.cli.params import (
    PORT,
    SECONDS,
    SECONDS_OR_ZERO,
    SERVICE_URL,
    FloatRange,
    StoreUrl,
    data_dir_option,
    prepare_data_dir,
    refuse_unless,
)
from segtxn.cli.repairs import repair_options
from segtxn.cli.retention import retention, retention_options
from segtxn.cli.security import (
    auth_options,
    auth_settings,
    check_scheme,
    pod_dns_url,
    store_credentials,
)
from segtxn.cli.traces import trace_option
from segtxn.connlimits import ConnectionLimits
from segtxn.coordinator.app import CoordinatorServer
from segtxn.coordinator.settings import CoordinatorSettings
from segtxn.ledger.replicas import RepairSettings, Replication

log = logging.getLogger(__name__)

Server = BrokerServer | CoordinatorServer
F = TypeVar("F", bound=Callable[..., None])

PUBLISH_BUFFER = click.option(
    "--publish-buffer-size",
    default=BrokerSettings.max_publish_buffer_bytes,
    show_default=True,
    type=click.IntRange(min=1),
    metavar="BYTES",
    help="Payload bytes of sends read from producers and not yet answered, over all "
    "connections; past it the broker stops reading producers' sockets until sends are "
    "answered. At least the largest message (5177344 bytes).",
)
"""``--publish-buffer-size``: ``BrokerSettings.max_publish_buffer_bytes``, passed to the
command as ``publish_buffer_size``."""

STORE_TIMEOUT_S = 15.0
SHUTDOWN_TIMEOUT_S = 20.0


def _run(make: Callable[[], list[Server]], shutdown_timeout_s: float, loop: EventLoop) -> None:
    """Serve on ``loop`` until SIGTERM or SIGINT; start-up and shutdown errors reach the
    CLI's edge (:mod:`segtxn.cli.errors`) as typed errors."""
    with lifecycle.catch_signals_early():
        log.info("event loop: %s", loop.name)
        with asyncio.Runner(loop_factory=loop.factory) as runner:
            runner.run(lifecycle.serve(make, shutdown_timeout_s=shutdown_timeout_s, say=say))


def _lifecycle_options(command: F) -> F:
    """``--store-timeout`` and ``--shutdown-timeout``: how long start-up waits for the store,
    and how long a stop may take; ``--log-format`` (:mod:`segtxn.cli.logs`); ``--event-loop``
    (:mod:`segtxn.cli.loops`); ``--access-log`` and the connection limits
    (:mod:`segtxn.cli.httpflags`)."""
    store = click.option(
        "--store-timeout",
        default=STORE_TIMEOUT_S,
        show_default=True,
        type=SECONDS_OR_ZERO,
        metavar="SECONDS",
        help="At start-up, keep trying to reach the metadata store this long, then exit 1 "
        "saying so (0: one attempt).",
    )
    shutdown = click.option(
        "--shutdown-timeout",
        default=SHUTDOWN_TIMEOUT_S,
        show_default=True,
        type=SECONDS,
        metavar="SECONDS",
        help="On SIGTERM or SIGINT, stop within this long (exit 0), else exit 1 anyway; a "
        "second signal exits at once.",
    )
    options = ACCESS_LOG(connection_options(store(shutdown(command))))
    return event_loop_option(log_format_option(options))


def _test_bugs() -> frozenset[str]:
    """``SEGTXN_TEST_BUGS`` (comma-separated): known bugs put back on purpose, so that the
    soak harness can show it catches them. Tests only."""
    return frozenset(
        b.strip() for b in os.environ.get("SEGTXN_TEST_BUGS", "").split(",") if b.strip()
    )


IDS = click.IntRange(1, 1024)
PORT_HELP = (
    "Port (default: the advertised port). 0: one the system picks, advertised in place of "
    "the port 0 that --advertise then names (http://host:0)."
)
STORE_HELP = (
    "Metadata store URL: etcd://host:port[,host:port...][/namespace] (memory:// for tests)."
)


@click.command()
@click.option("--store", required=True, type=StoreUrl(), help=STORE_HELP)
@data_dir_option(
    required=True, help="Where this broker keeps its ledgers (and, with --replication, replicas)."
)
@click.option(
    "--advertise",
    required=True,
    type=SERVICE_URL,
    help="How clients and other brokers reach this broker: http://host:port",
)
@click.option(
    "--broker-id", default=None, help="Stable id, 1-63 of A-Z a-z 0-9 _ . - (default: host-port)."
)
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=None, type=PORT, help=PORT_HELP)
@click.option("--auto-create-topics", is_flag=True, help="Create persistent topics on first use.")
@click.option(
    "--session-ttl",
    default=10.0,
    show_default=True,
    type=SECONDS,
    help="Seconds the store keeps this broker registered without hearing from it.",
)
@click.option(
    "--consumer-hold",
    default=10.0,
    show_default=True,
    type=SECONDS_OR_ZERO,
    help="Seconds a dropped Failover member keeps its segments (0: they move at once).",
)
@click.option(
    "--header-watch",
    type=click.Choice([mode.value for mode in HeaderWatch]),
    default=HeaderWatch.PREFIX.value,
    show_default=True,
    help="How the broker follows transaction headers: prefix (one watch on all of them) "
    "or scoped (one per transaction its segments touch, on one stream).",
)
@click.option(
    "--replication",
    default=None,
    metavar="W/A",
    help="Replicate new ledgers on W brokers, each entry acknowledged once A have it "
    "(e.g. 3/2; A at most a majority of W). Default: each ledger on its broker's disk only.",
)
@PUBLISH_BUFFER
@repair_options(broker=True)
@retention_options
@_lifecycle_options
@auth_options
def broker(
    *,
    publish_buffer_size: int,
    replication: str | None,
    repair: RepairSettings,
    session_ttl: float,
    consumer_hold: float,
    header_watch: str,
    retention_time: float,
    retention_size: int,
    store: str,
    data_dir: Path,
    advertise: str,
    broker_id: str | None,
    host: str,
    port: int | None,
    auto_create_topics: bool,
    store_timeout: float,
    shutdown_timeout: float,
    event_loop: EventLoop,
    access_log: bool,
    connections: ConnectionLimits,
    **auth_flags: Any,
) -> None:
    """Run one broker of a cluster until SIGTERM or SIGINT."""
    credentials = store_credentials(auth_flags, store)
    auth = auth_settings(**auth_flags)
    check_scheme(auth, advertise, "--advertise")
    parts = urlsplit(advertise)
    with contextlib.ExitStack() as held:
        listener, advertise = listen_as_advertised(held, host, port, advertise)
        try:
            settings = BrokerSettings(
                broker_id=broker_id or f"{parts.hostname}-{parts.port}",
                advertise_url=advertise,
                store_url=store,
                store_credentials=credentials,
                ledger_url=f"file://{claim_data_dir(held, data_dir)}",
                replication=Replication.parse(replication) if replication else None,
                repair=repair,
                auto_create_topics=auto_create_topics,
                session_ttl_s=session_ttl,
                store_timeout_s=store_timeout,
                consumer_hold_s=consumer_hold,
                header_watch=HeaderWatch(header_watch),
                max_publish_buffer_bytes=publish_buffer_size,
                test_bugs=_test_bugs(),
                retention=retention(retention_time, retention_size),
                auth=auth,
                connections=connections,
            )
        except ValueError as e:
            raise click.UsageError(str(e)) from e

        server = partial(
            BrokerServer, settings, host=host, port=port, access_log=access_log, listener=listener
        )
        _run(lambda: [server()], shutdown_timeout, event_loop)


@click.command()
@click.option("--store", required=True, type=StoreUrl(), help=STORE_HELP)
@click.option(
    "--advertise", required=True, type=SERVICE_URL, help="How clients reach it: http://host:port"
)
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=None, type=PORT, help=PORT_HELP)
@click.option("--ids", default=4, show_default=True, type=IDS, help="Number of v5 coordinator ids.")
@click.option(
    "--gc-retention",
    default=60.0,
    show_default=True,
    type=SECONDS_OR_ZERO,
    help="Seconds a finished transaction's header is kept before GC (v4: its state in "
    "the transaction log, which then answers a repeated END_TXN).",
)
@click.option(
    "--gc-sweep", default=10.0, show_default=True, type=SECONDS, help="Seconds between GC sweeps."
)
@click.option(
    "--default-timeout",
    default=60.0,
    show_default=True,
    type=FloatRange(0, 3600, min_open=True),
    help="Transaction timeout in seconds when a client asks for none.",
)
@click.option(
    "--timeout-sweep",
    default=1.0,
    show_default=True,
    type=SECONDS,
    help="Seconds between timeout sweeps.",
)
@click.option(
    "--session-ttl",
    default=10.0,
    show_default=True,
    type=SECONDS,
    help="Seconds before a standby takes the ids of a coordinator it stopped hearing from.",
)
@data_dir_option(
    required=False,
    help="Keep v4 transaction logs here; enables v4 transactions (persistent:// topics). "
    "Whoever may take a v4 id over must see the same directory (unless --replication).",
)
@click.option(
    "--replication",
    default=None,
    metavar="W/A",
    help="Keep v4 transaction logs on W brokers' storage nodes, each entry acknowledged once "
    "A have it (brokers started with --replication); enables v4 transactions, and any "
    "coordinator can take a v4 id over without a shared directory.",
)
@click.option(
    "--v4-ids",
    default=2,
    show_default=True,
    type=IDS,
    help="v4 coordinator ids (with --data-dir or --replication).",
)
@click.option(
    "--pod-dns",
    metavar="DOMAIN",
    default=None,
    help="Advertise the host of --advertise, an IP address, as its Kubernetes pod DNS name "
    "(10.1.2.3 as 10-1-2-3.DOMAIN, e.g. DOMAIN ns.pod): a Deployment's pod has no other "
    "stable name for a TLS certificate to cover.",
)
@repair_options(broker=False)
@_lifecycle_options
@auth_options
@click.pass_context
def coordinator(
    ctx: click.Context,
    /,
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
    replication: str | None,
    repair: RepairSettings,
    v4_ids: int,
    pod_dns: str | None,
    store_timeout: float,
    shutdown_timeout: float,
    event_loop: EventLoop,
    access_log: bool,
    connections: ConnectionLimits,
    **auth_flags: Any,
) -> None:
    """Run a transaction coordinator until SIGTERM or SIGINT: v5, and v4 with --data-dir or
    --replication (several processes share the ids; standbys take over)."""
    credentials = store_credentials(auth_flags, store)
    auth = auth_settings(**auth_flags)
    check_scheme(auth, advertise, "--advertise")
    v4 = data_dir is not None or replication is not None
    refuse_unless(ctx, "v4_ids", v4, "v4 transactions need --data-dir or --replication")
    try:
        replicated = Replication.parse(replication) if replication else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--replication") from e
    with contextlib.ExitStack() as held:
        listener, advertise = listen_as_advertised(held, host, port, advertise)
        if pod_dns is not None:
            advertise = pod_dns_url(advertise, pod_dns)
        settings = CoordinatorSettings(
            advertise_url=advertise,
            store_url=store,
            store_credentials=credentials,
            coordinator_ids=ids,
            gc_retention_s=gc_retention,
            gc_sweep_s=gc_sweep,
            default_timeout_s=default_timeout,
            timeout_sweep_s=timeout_sweep,
            session_ttl_s=session_ttl,
            store_timeout_s=store_timeout,
            v4_coordinator_ids=v4_ids if v4 else 0,
            ledger_url=f"file://{prepare_data_dir(data_dir)}" if data_dir else "memory://",
            replication=replicated,
            repair=repair,
            auth=auth,
            connections=connections,
        )

        server = partial(
            CoordinatorServer,
            settings,
            host=host,
            port=port,
            access_log=access_log,
            listener=listener,
        )
        _run(lambda: [server()], shutdown_timeout, event_loop)


@click.command()
@click.option(
    "--store",
    default="memory://",
    show_default=True,
    type=StoreUrl(),
    help="memory:// (nothing persists) or etcd://host:port[/ns] (with --data-dir, persists).",
)
@data_dir_option(
    required=False,
    help="Keep ledgers here (needs an etcd store: a memory store forgets their metadata).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=8080, show_default=True, type=PORT, help="Broker port (0: a free one)."
)
@click.option(
    "--coordinator-port",
    default=None,
    type=PORT,
    help="Coordinator port (default or 0: a free one).",
)
@click.option("--auto-create-topics", is_flag=True, help="Create persistent topics on first use.")
@PUBLISH_BUFFER
@retention_options
@_lifecycle_options
@auth_options
@trace_option
def standalone(
    *,
    publish_buffer_size: int,
    store: str,
    data_dir: Path | None,
    host: str,
    port: int,
    coordinator_port: int | None,
    auto_create_topics: bool,
    retention_time: float,
    retention_size: int,
    store_timeout: float,
    shutdown_timeout: float,
    event_loop: EventLoop,
    access_log: bool,
    connections: ConnectionLimits,
    trace: bool,
    **auth_flags: Any,
) -> None:
    """Run a whole cluster in one process until SIGTERM or SIGINT: a broker and a transaction
    coordinator on one metadata store (the embedded one by default). Security is off unless
    the --auth-* flags are given; --trace prints the spans of traced clients' requests."""
    credentials = store_credentials(auth_flags, store)
    auth = auth_settings(**auth_flags)
    scheme = "https" if auth.tls.enabled else "http"
    if data_dir is not None and store.startswith("memory:"):
        raise click.UsageError(
            "--data-dir needs --store etcd://...: a memory store forgets the ledgers' "
            "metadata on restart, and segtxn never overwrites ledger files it cannot account for"
        )
    if port and coordinator_port == port:  # else the broker starts, then the coordinator fails
        raise click.BadParameter(
            f"{port} is the broker's --port too: the broker and the coordinator listen on "
            "a port each",
            param_hint="'--coordinator-port'",
        )
    with contextlib.ExitStack() as held:
        ledger_url = f"file://{claim_data_dir(held, data_dir)}" if data_dir else "memory://"
        # port 0: each listens from now on, on a port the system picks (not the other's)
        node_listener = listen_on_a_free_port(held, host, coordinator_port) if not port else None
        txn_listener = listen_on_a_free_port(held, host, port) if not coordinator_port else None
        port = node_listener.port if node_listener else port
        coordinator_port = txn_listener.port if txn_listener else coordinator_port or 0
        try:
            broker_settings = BrokerSettings(
                broker_id="standalone",
                advertise_url=url_of(scheme, host, port),
                store_url=store,
                store_credentials=credentials,
                ledger_url=ledger_url,
                auto_create_topics=auto_create_topics,
                store_timeout_s=store_timeout,
                max_publish_buffer_bytes=publish_buffer_size,
                test_bugs=_test_bugs(),
                retention=retention(retention_time, retention_size),
                auth=auth,
                connections=connections,
            )
        except ValueError as e:
            raise click.UsageError(str(e)) from e
        coordinator_settings = CoordinatorSettings(
            advertise_url=url_of(scheme, host, coordinator_port),
            store_url=store,
            store_credentials=credentials,
            store_timeout_s=store_timeout,
            v4_coordinator_ids=2,
            ledger_url=f"file://{(data_dir / 'txn-log').resolve()}" if data_dir else "memory://",
            auth=auth,
            connections=connections,
        )

        def servers() -> list[Server]:
            node = BrokerServer(
                broker_settings, host=host, port=port, access_log=access_log, listener=node_listener
            )
            # one process, one store: a memory:// URL opened twice would be two unrelated ones
            txn = CoordinatorServer(
                coordinator_settings,
                host=host,
                port=coordinator_port,
                store=node.service.store,
                access_log=access_log,
                listener=txn_listener,
            )
            return [node, txn]

        _run(servers, shutdown_timeout, event_loop)
