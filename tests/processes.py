"""Real segtxn server processes for tests: start, wait until ready, pause (SIGSTOP) and
resume, SIGKILL, restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from segtxn.verify.processes import READY_LIMIT_S, serving_port
from tests.waiting import wait_until

SEGTXN = str(Path(sys.executable).with_name("segtxn"))
SERVING_S = READY_LIMIT_S
"""How long a server may take to name its port (start-up on a busy machine)."""


class ServerProcess:
    """``segtxn <command> ...`` on a port it picks at its first start, kept across restarts.

    The first start listens on port 0 (an advertised port 0, or ``--port 0``): the server
    binds a port the system picks and holds it from then on, and names it on its
    ``serving:`` line, read from its log. (A port picked here by binding a socket and closing
    it again was free only until another process bound it, and the server then failed to
    start: address already in use.) A restart is given that port again: the test's clients
    keep its URL."""

    def __init__(
        self,
        command: list[str],
        name: str,
        *,
        advertise: bool = True,
        log: Path | None = None,
        coordinator: bool = False,
    ) -> None:
        """``advertise``: the command takes ``--advertise URL --host``; else ``--port``.
        ``log``: append the process's stderr (its log) to this file, else to a temporary
        file of its own (removed when it stops). ``coordinator``: it also serves a
        coordinator (``standalone``), on ``--coordinator-port`` picked and kept the same way."""
        self._port = 0
        self._coordinator = coordinator
        self._coordinator_port = 0
        self.name = name
        self._command = command
        self._advertise = advertise
        self._own_log = log is None
        if log is None:
            descriptor, path = tempfile.mkstemp(suffix=".log")
            os.close(descriptor)  # the process appends to it by name
            log = Path(path)
        self.log = log
        self._log_from = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        """The port it serves on; waits (at most SERVING_S, blocking: await :meth:`serving`
        or :meth:`ready` first in a test's event loop) for the first start to name it."""
        if not self._port:
            deadline = time.monotonic() + SERVING_S
            while not self._poll_serving():
                if time.monotonic() > deadline:
                    raise AssertionError(self._no_serving_line())
                time.sleep(0.05)  # sleep-ok: polling a file another process writes
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        where = (
            ["--advertise", f"http://127.0.0.1:{self._port}"]
            if self._advertise
            else ["--port", str(self._port)]
        )
        if self._coordinator:
            where += ["--coordinator-port", str(self._coordinator_port)]
        args = [SEGTXN, *self._command, *where, "--host", "127.0.0.1"]
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)

    def log_text(self) -> str:
        """What the process has logged so far."""
        return self.log.read_text() if self.log.exists() else ""

    async def serving(self, limit_s: float = SERVING_S) -> None:
        """Wait until it named its port (at once after its first start)."""
        await wait_until(self._poll_serving, timeout=limit_s, what=self._no_serving_line())

    async def ready(self, limit_s: float = READY_LIMIT_S) -> None:
        """Wait until it named its port (its first start) and answers ``/readyz`` with 200,
        each within ``limit_s``."""
        await self.serving(limit_s)
        await wait_ready(self.url, self.name, limit_s)

    def _poll_serving(self) -> bool:
        """Whether the port is known (read now from the log if the server has said it)."""
        named = self._port and (self._coordinator_port or not self._coordinator)
        if not named and self.log.exists():
            with self.log.open("rb") as log:
                log.seek(self._log_from)
                text = log.read().decode(errors="replace")
            self._port = self._port or serving_port(text) or 0
            if self._coordinator and not self._coordinator_port:
                self._coordinator_port = serving_port(text, coordinator=True) or 0
        return bool(self._port and (self._coordinator_port or not self._coordinator))

    def _no_serving_line(self) -> str:
        exited = self.proc is not None and self.proc.poll() is not None
        return (
            f"{self.name}'s 'serving:' line naming its port (in {self.log}"
            + (", and it has exited" if exited else "")
            + ")"
        )

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
        if self._own_log:
            self.log.unlink(missing_ok=True)


async def wait_ready(url: str, name: str, limit_s: float = READY_LIMIT_S) -> None:
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
        ["standalone", *extra],
        "standalone",
        advertise=False,
        coordinator=True,
    )
