"""Real segtxn server processes for tests: start, wait until ready, pause (SIGSTOP) and
resume, SIGKILL, restart."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from segtxn.metastore.etcd_server import free_port
from tests.waiting import wait_until

SEGTXN = str(Path(sys.executable).with_name("segtxn"))


class ServerProcess:
    """``segtxn <command> ...`` on a fixed free port (kept across restarts)."""

    def __init__(
        self, command: list[str], name: str, *, advertise: bool = True, log: Path | None = None
    ) -> None:
        """``advertise``: the command takes ``--advertise URL --host``; else ``--port``.
        ``log``: append the process's stderr (its log) to this file, else discard it."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = name
        self._command = command
        self._advertise = advertise
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        where = ["--advertise", self.url] if self._advertise else ["--port", str(self.port)]
        args = [SEGTXN, *self._command, *where, "--host", "127.0.0.1"]
        if self.log is None:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return
        with self.log.open("ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)

    def log_text(self) -> str:
        """What the process has logged so far (with ``log``)."""
        return self.log.read_text() if self.log is not None and self.log.exists() else ""

    async def ready(self, limit_s: float = 30) -> None:
        await wait_ready(self.url, self.name, limit_s)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP: the process answers nothing, yet the kernel still accepts connections
        to its port (what a client sees of a broker stalled by GC, swap or a debugger)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused process cannot exit
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


async def wait_ready(url: str, name: str, limit_s: float = 30) -> None:
    """Wait until the server at ``url`` answers ``/readyz`` with 200 (bounded)."""
    async with aiohttp.ClientSession() as session:

        async def up() -> bool:
            try:
                async with session.get(url + "/readyz") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(up, timeout=limit_s, what=f"{name} ready")


def broker(
    store: str,
    data_dir: Path,
    broker_id: str,
    *,
    session_ttl: float = 10,
    log: Path | None = None,
    extra: tuple[str, ...] = (),
) -> ServerProcess:
    return ServerProcess(
        ["broker", "--store", store, "--data-dir", str(data_dir), "--broker-id", broker_id,
         "--session-ttl", str(session_ttl), *extra],
        f"broker {broker_id}",
        log=log,
    )  # fmt: skip


def coordinator(
    store: str,
    name: str,
    *,
    session_ttl: float = 10,
    log: Path | None = None,
    extra: tuple[str, ...] = (),
) -> ServerProcess:
    return ServerProcess(
        ["coordinator", "--store", store, "--session-ttl", str(session_ttl),
         "--gc-retention", "0", *extra],
        f"coordinator {name}",
        log=log,
    )  # fmt: skip


async def replicated_brokers(
    store: str, tmp_path: Path, started: list[ServerProcess], *, session_ttl: float
) -> list[ServerProcess]:
    """Brokers b0, b1, b2 with ledgers replicated 3/2, started and ready (and in
    ``started``, so the test's fixture stops them); each logs to ``tmp_path/b<i>.log``."""
    brokers = [
        broker(
            store,
            tmp_path / f"b{i}",
            f"b{i}",
            session_ttl=session_ttl,
            log=tmp_path / f"b{i}.log",
            extra=("--replication", "3/2"),
        )
        for i in range(3)
    ]
    started += brokers
    for server in brokers:
        server.start()
    for server in brokers:
        await server.ready()
    return brokers


def standalone(*extra: str) -> ServerProcess:
    """``extra``: more flags (e.g. ``--store``, ``--data-dir``), kept across restarts."""
    return ServerProcess(
        ["standalone", "--coordinator-port", str(free_port()), *extra],
        "standalone",
        advertise=False,
    )
