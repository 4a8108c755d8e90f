"""The processes a verification run starts: restartable, signalled, and logged per incarnation.

``segtxn demo`` and the soak start servers (standalone, brokers, a coordinator) and processors
as child processes, and their faults SIGKILL, SIGSTOP and restart them. A failing run is
diagnosed from its logs, so every process writes to one file in the run's ``logs/``
directory, and every incarnation of it is appended to that file after a marker line that
says which incarnation it is, why it started, its command line and what the harness put in
its environment; another marker says how it ended. :class:`Launch` carries what every child
gets: the verbosity (``-v``/``-vv`` before the subcommand) and extra environment (e.g.
``SEGTXN_TEST_BUGS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

MARKER = "==== segtxn harness:"
"""The start of every line the harness writes into a process's log."""

DUMP_END = "==== stacks (SIGUSR1): end ===="
"""The last line of a stack dump (:mod:`segtxn.cli.stacks`)."""

TEST_BUGS_ENV = "SEGTXN_TEST_BUGS"
"""Names a known race the product re-introduces on purpose (``--inject-bug``)."""


@dataclass(frozen=True)
class Launch:
    """What every child process of a run gets."""

    verbosity: int = 1
    """``-v`` count before the subcommand: 1 logs INFO (the default), 2 DEBUG, 0 WARNING."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables."""

    def segtxn(self, *args: str) -> list[str]:
        """The command line of ``segtxn <args>`` in this Python, at this verbosity."""
        verbose = ["-" + "v" * min(self.verbosity, 2)] if self.verbosity > 0 else []
        return [sys.executable, "-m", "segtxn.cli", *verbose, *args]


class ManagedProcess:
    """One child process, started, signalled and restarted by the harness."""

    def __init__(self, name: str, command: list[str], log_path: Path, launch: Launch) -> None:
        self.name = name
        self.command = command
        self.log_path = log_path
        self.launch = launch
        self.incarnation = 0
        self.process: asyncio.subprocess.Process | None = None
        self.exited_on_its_own: list[int] = []
        """Exit codes of incarnations that ended without the harness asking (crashes)."""
        self._accounted = False
        """This incarnation's end is the harness's doing, or already noted."""
        self._watch: asyncio.Task[None] | None = None
        """Notes the incarnation's end the moment it exits by itself (the log's timeline)."""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def note(self, text: str) -> None:
        """Append a marker line to the process's log."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(self.log_path, "ab") as log:
            log.write(f"{MARKER} {stamp} {self.name}: {text} ====\n".encode())

    async def start(self, why: str = "start") -> None:
        """Start the next incarnation (the previous one must have ended)."""
        if self.running:
            raise RuntimeError(f"{self.name} is running: stop or kill it first")
        await self._unwatch()
        self.check_exit()
        self.incarnation += 1
        self._accounted = False
        extra = " ".join(f"{k}={v}" for k, v in self.launch.env.items())
        self.note(
            f"incarnation {self.incarnation} ({why}): {shlex.join(self.command)}"
            + (f" [env {extra}]" if extra else "")
        )
        env = {**os.environ, **self.launch.env}
        # the child holds its own copy of the descriptor: ours is closed at once
        with open(self.log_path, "ab") as log:  # noqa: ASYNC230 - a local file, opened once
            self.process = await asyncio.create_subprocess_exec(
                *self.command, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env
            )
        self._watch = asyncio.create_task(
            self._watch_exit(self.process), name=f"watch-{self.name}-{self.incarnation}"
        )

    async def _watch_exit(self, process: asyncio.subprocess.Process) -> None:
        await process.wait()
        if process is self.process:
            self.check_exit()

    async def _unwatch(self) -> None:
        """The incarnation has ended: its watcher ends too (awaited: every task has an owner)."""
        if self._watch is not None:
            await self._watch
            self._watch = None

    def send(self, sig: signal.Signals) -> None:
        if self.running:
            assert self.process is not None
            self.process.send_signal(sig)

    def check_exit(self) -> None:
        """Note an incarnation that ended by itself (before the harness stopped or killed it)
        in :attr:`exited_on_its_own` and the log."""
        if self.process is not None and self.process.returncode is not None:
            if self._accounted:
                return
            self._accounted = True
            code = self.process.returncode
            self.exited_on_its_own.append(code)
            self.note(f"incarnation {self.incarnation} had exited by itself, exit code {code}")

    async def dump_stacks(self, limit_s: float = 5.0) -> None:
        """SIGUSR1 (:mod:`segtxn.cli.stacks`): wait up to ``limit_s`` for the stacks of every
        thread and asyncio task to be in the log."""
        if not self.running:
            return
        before = self.log_path.read_bytes().count(DUMP_END.encode())
        self.note("SIGUSR1: dump stacks")
        self.send(signal.SIGUSR1)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while loop.time() < deadline and self.running:
            if self.log_path.read_bytes().count(DUMP_END.encode()) > before:
                return
            await asyncio.sleep(0.05)  # sleep-ok: polling a file another process writes
        self.note(f"no stack dump in {limit_s:g} s (stuck outside Python?)")

    async def kill(self, why: str = "") -> None:
        """SIGKILL, and wait for it to be gone."""
        if self.process is None:
            return
        self.check_exit()
        self._accounted = True
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        await self._unwatch()
        self.note(f"incarnation {self.incarnation} SIGKILLed" + (f" ({why})" if why else ""))

    async def stop(self, limit_s: float = 30.0) -> int | None:
        """SIGTERM (and SIGCONT, should it be stopped), SIGKILL after ``limit_s``; the exit
        code (None: never started)."""
        if self.process is None:
            return None
        self.check_exit()
        self._accounted = True
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.send_signal(signal.SIGCONT)
            try:
                async with asyncio.timeout(limit_s):
                    await self.process.wait()
            except TimeoutError:
                self.note(f"incarnation {self.incarnation} did not stop in {limit_s:g} s")
                await self.dump_stacks()
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    self.process.kill()
                await self.process.wait()
            self.note(f"incarnation {self.incarnation} ended, exit code {self.process.returncode}")
        await self._unwatch()
        return self.process.returncode

    def tail(self, n: int = 1500) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-n:].decode(errors="replace")


READY_LIMIT_S = 60.0
"""How long a server the harness started has to say its port and answer ``/readyz``. On a
2-core machine busy with other work a broker's interpreter took 31 s just to import (the
soak's cluster run then failed with "b1 was not ready in 30 s"); a healthy start takes 1-2 s,
so a longer bound costs nothing when all is well."""


class ServerProcess(ManagedProcess):
    """A segtxn server on a loopback port kept across restarts (with its broker id and data
    dir, which are in its command line).

    Its first incarnation listens on port 0: the server binds a port the system picks and
    holds it from then on, and says which on its ``serving:`` line, which :meth:`ready`
    reads from the log. (A port picked by the harness, by binding a socket and closing it
    again, was free only until another process bound it: the server then failed to start,
    address already in use, and the run with it.) Later incarnations are given that port
    again, as the clients of the run keep its URL."""

    def __init__(
        self,
        name: str,
        command_on: Callable[[int], list[str]],
        log_path: Path,
        launch: Launch,
        *,
        coordinator: bool = False,
    ) -> None:
        """``command_on(port)``: the command line of a server listening on ``port`` (0: a
        port it picks, and advertises). ``coordinator``: it also serves a transaction
        coordinator (``standalone``), given ``--coordinator-port`` the same way: 0 at first,
        then the port it named (a coordinator on a new port would leave its old URL in the
        store, and its clients calling there, until its session expired)."""
        super().__init__(name, command_on(0), log_path, launch)
        self._command_on = command_on
        self.port = 0
        """0 until the first incarnation said on which port it serves."""
        self._coordinator = coordinator
        self.coordinator_port = 0
        """With ``coordinator``: 0 until the first incarnation named its coordinator's port."""
        self._log_from = 0
        """Where this incarnation's lines begin in the log."""

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError(f"{self.name} has not said its port yet: await ready() first")
        return f"http://127.0.0.1:{self.port}"

    async def start(self, why: str = "start") -> None:
        self.command = self._command_on(self.port)
        if self._coordinator:
            self.command += ["--coordinator-port", str(self.coordinator_port)]
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        await super().start(why)

    async def ready(self, limit_s: float = READY_LIMIT_S) -> None:
        """Wait until the server has said its port (its first incarnation) and ``/readyz``
        answers 200, both within ``limit_s``.

        Raises:
            ServerFailed: it exited, or was not ready in ``limit_s``.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while not self._named():
            if not self.running:
                raise ServerFailed(f"{self.name} exited at start-up: {self.tail(500)}")
            if loop.time() >= deadline:
                raise ServerFailed(
                    f"{self.name} printed no 'serving:' line naming its port in {limit_s:g} s "
                    f"(see {self.log_path}): {self.tail(500)}"
                )
            await asyncio.sleep(0.05)  # sleep-ok: polling a file another process writes
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while loop.time() < deadline:
                if not self.running:
                    raise ServerFailed(f"{self.name} exited at start-up: {self.tail(500)}")
                try:
                    async with session.get(self.url + "/readyz") as response:
                        if response.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.05)  # sleep-ok: the process is starting; only its port tells
        raise ServerFailed(f"{self.name} was not ready in {limit_s:g} s: {self.tail(500)}")

    def _named(self) -> bool:
        """Whether its ports are known (read now from the log if it has named them)."""
        if self.port and (self.coordinator_port or not self._coordinator):
            return True
        log = self._incarnation_log()
        self.port = self.port or serving_port(log) or 0
        if self._coordinator:
            self.coordinator_port = (
                self.coordinator_port or serving_port(log, coordinator=True) or 0
            )
        return bool(self.port and (self.coordinator_port or not self._coordinator))

    def _incarnation_log(self) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(self._log_from)
            return log.read().decode(errors="replace")


SERVING = re.compile(r"serving: (?:broker \S+|transaction coordinator) on https?://[^\s\"]*:(\d+)")
"""A server command's line saying where it serves (segtxn/cli/lifecycle.py), plain or within
a JSON log line; ``standalone`` says its broker's first."""


COORDINATOR_SERVING = re.compile(r"serving: transaction coordinator on https?://[^\s\"]*:(\d+)")
"""The line naming the coordinator's port (``standalone`` names its broker's first)."""


def serving_port(log: str, *, coordinator: bool = False) -> int | None:
    """The port of the first ``serving:`` line in ``log`` (``coordinator``: of the first
    naming a coordinator, as ``standalone`` does second); None: none yet."""
    found = (COORDINATOR_SERVING if coordinator else SERVING).search(log)
    return int(found.group(1)) if found else None


class ServerFailed(RuntimeError):
    """A server the harness started did not come up (its log's tail is in the message)."""
