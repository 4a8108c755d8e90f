"""A verification run's cluster: servers as processes on a store, which faults can restart.

``segtxn demo`` and the soak both start their clusters here, in one of three shapes
(:class:`segtxn.verify.plan.Shape`):

- ``standalone-memory``: one ``segtxn standalone`` on the embedded store;
- ``standalone-etcd``: one ``segtxn standalone --store etcd://... --data-dir DIR`` on a
  private etcd, which survives a restart (the embedded store forgets everything);
- ``cluster-etcd``: brokers ``b1`` and ``b2`` and a coordinator, each its own process, on a
  private etcd (or on an etcd the caller names);
- ``cluster-replicated``: brokers ``b1``, ``b2`` and ``b3`` with ``--replication 3/2`` and a
  short session (:data:`~segtxn.verify.plan.REPLICATED_SESSION_TTL_S`), and a coordinator,
  on a short session too (:data:`~segtxn.verify.plan.COORDINATOR_SESSION_TTL_S`).

Each server listens on a loopback port of its own, which it picks (port 0) and names on its
``serving:`` line, and is kept across restarts; each keeps its
ledgers under ``<run dir>/data/<name>``; :meth:`Cluster.restart_server` starts a SIGKILLed
one again with the same id, data dir and port. The private etcd keeps its data in
``/dev/shm`` (removed when the cluster stops) and its log in ``<run dir>/logs/etcd.log``;
:meth:`Cluster.stop_etcd` and :meth:`Cluster.start_etcd` restart it on the same data dir and
ports. The private etcd is defragmented when compaction has freed enough of its file
(:data:`segtxn.metastore.defrag.PRIVATE_ETCD`). Every process's log is in ``<run dir>/logs/``
(:mod:`segtxn.verify.processes`).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from segtxn.metastore.defrag import PRIVATE_ETCD, run_defragmentation
from segtxn.metastore.etcd_server import EtcdServer
from segtxn.metastore.registry import open_store
from segtxn.verify.plan import COORDINATOR_SESSION_TTL_S, REPLICATED_SESSION_TTL_S, Shape
from segtxn.verify.processes import MARKER, Launch, ServerProcess

NAMESPACE = "/segtxn"
"""The key prefix of a run's cluster on its private etcd."""


class Cluster:
    """The running servers of one run (and its private etcd, if any)."""

    def __init__(
        self,
        shape: Shape,
        store: str,
        servers: list[ServerProcess],
        etcd: EtcdServer | None,
        data: Path,
    ) -> None:
        self.shape = shape
        self.store = store
        self.servers = {s.name: s for s in servers}
        self.etcd = etcd
        self._data = data

    @property
    def url(self) -> str:
        """The service URLs clients are given: every broker's, comma-separated (the
        client tries the next when one is down), or the standalone's."""
        urls = [s.url for s in self.servers.values() if s.name != "coordinator"]
        return ",".join(urls)

    async def kill_server(self, name: str, why: str = "") -> None:
        await self.servers[name].kill(why)

    async def restart_server(self, name: str, why: str = "restart") -> None:
        """Start ``name`` again on its data dir and port; wait until it is ready.

        Raises:
            ServerFailed: it did not come back.
        """
        server = self.servers[name]
        await server.start(why)
        await server.ready()

    def wipe_server(self, name: str) -> None:
        """Empty the data directory of ``name`` (killed first: it is not running)."""
        if self.servers[name].running:
            raise ValueError(f"{name} is running: kill it before emptying its data directory")
        shutil.rmtree(self._data / name, ignore_errors=True)
        self.servers[name].note("its data directory was emptied")

    def signal_server(self, name: str, sig: signal.Signals, why: str) -> None:
        """Send ``sig`` to server ``name`` (SIGSTOP, SIGCONT), saying ``why`` in its log."""
        server = self.servers[name]
        server.note(why)
        server.send(sig)

    async def stop_etcd(self) -> None:
        """Stop the private etcd (SIGTERM), keeping its data."""
        if self.etcd is None:
            raise ValueError("this cluster has no private etcd to stop")
        _note(self.etcd, "stopping (a fault: it restarts on the same data dir and ports)")
        await asyncio.to_thread(self.etcd.stop, remove_data=False)

    async def start_etcd(self) -> None:
        if self.etcd is None:
            raise ValueError("this cluster has no private etcd to start")
        _note(self.etcd, "starting again")
        await self.etcd.astart()

    def crashed(self) -> dict[str, list[int]]:
        """Servers that exited without the harness asking: their exit codes."""
        for server in self.servers.values():
            server.check_exit()
        return {n: s.exited_on_its_own for n, s in self.servers.items() if s.exited_on_its_own}

    async def dump_stacks(self) -> None:
        """Every server's threads and asyncio tasks into its log (SIGUSR1)."""
        await asyncio.gather(*(s.dump_stacks() for s in self.servers.values()))

    async def stop(self) -> None:
        """Stop every server (last started first)."""
        for server in reversed(self.servers.values()):
            await server.stop(15.0)


@asynccontextmanager
async def open_cluster(
    shape: Shape,
    run_dir: Path,
    *,
    launch: Launch,
    store: str | None = None,
    echo: Callable[[str], None] = print,
) -> AsyncIterator[Cluster]:
    """Start a cluster of ``shape`` for the run in ``run_dir``; stop it (and remove its private
    etcd's data) on exit.

    Args:
        store: for ``cluster-etcd``, an etcd URL to use instead of starting a private etcd
            (faults cannot restart it).

    Raises:
        ServerFailed: a server did not come up.
        MetadataStoreError: ``store`` cannot be opened.
    """
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    async with AsyncExitStack() as stack:
        etcd = None
        if shape.on_etcd and store is None:
            etcd = EtcdServer.in_temp_dir()
            etcd.log_path = logs / "etcd.log"
            stack.push_async_callback(asyncio.to_thread, etcd.stop)
            await etcd.astart()
            store = etcd.url(NAMESPACE)
            echo(f"started etcd at {etcd.endpoint} (data in {etcd.data_dir})")
            defrag = asyncio.create_task(
                run_defragmentation([etcd.endpoint], PRIVATE_ETCD), name="etcd-defragmentation"
            )
            stack.push_async_callback(_stop, defrag)
        elif store is not None:
            opened = open_store(store)  # InvalidArgument for a URL nothing can open
            await opened.close()
        else:
            store = "memory://"
        servers: list[ServerProcess] = []

        def server(
            name: str, *args: str, advertise: bool = True, coordinator: bool = False
        ) -> ServerProcess:
            def command_on(port: int) -> list[str]:
                where = ["--host", "127.0.0.1"]
                if advertise:  # an advertised port 0: the port picked, advertised
                    where += ["--advertise", f"http://127.0.0.1:{port}"]
                else:
                    where += ["--port", str(port)]
                return launch.segtxn(*args, *where)

            process = ServerProcess(
                name, command_on, logs / f"{name}.log", launch, coordinator=coordinator
            )
            servers.append(process)
            return process

        if shape in (Shape.CLUSTER_ETCD, Shape.CLUSTER_REPLICATED):
            replication = (
                ["--replication", "3/2", "--session-ttl", f"{REPLICATED_SESSION_TTL_S:g}"]
                if shape.replicated
                else []
            )
            for name in shape.servers:
                data = str(run_dir / "data" / name)
                server(
                    name,
                    *("broker", "--store", store, "--broker-id", name, "--data-dir", data),
                    *replication,
                )
            session = (
                ["--session-ttl", f"{COORDINATOR_SESSION_TTL_S:g}"] if shape.replicated else []
            )
            server("coordinator", "coordinator", "--store", store, *session)
        else:
            args = ["standalone", "--store", store]
            if shape is Shape.STANDALONE_ETCD:
                args += ["--data-dir", str(run_dir / "data" / "standalone")]
            server("standalone", *args, advertise=False, coordinator=True)
        cluster = Cluster(shape, store, servers, etcd, run_dir / "data")
        stack.push_async_callback(cluster.stop)
        for process in servers:  # each on its own: start them all, then wait
            await process.start()
        for process in servers:
            await process.ready()
        where = "embedded store" if store == "memory://" else store
        echo(f"{shape.value}: {', '.join(f'{s.name} {s.url}' for s in servers)} on {where}")
        yield cluster


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _note(etcd: EtcdServer, text: str) -> None:
    if etcd.log_path is not None:
        with open(etcd.log_path, "ab") as log:
            log.write(f"{MARKER} etcd {etcd.endpoint}: {text} ====\n".encode())
