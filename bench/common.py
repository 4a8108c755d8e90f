"""What the benchmarks share: server processes (``python -m segtxn.cli <command>`` on a free
loopback port, logging to a file, ready when ``/readyz`` answers, stopped with SIGTERM then
SIGKILL, or killed and started again on the same port), percentiles, table printing, and
where a directory lives."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from segtxn.metastore.etcd_server import free_port

if TYPE_CHECKING:
    from segtxn.broker.app import BrokerServer

READY_TIMEOUT_S = 30.0


class ServerProcess:
    """``python -m segtxn.cli <command> ...`` on a free loopback port, output to a log."""

    def __init__(self, name: str, command: list[str], log_path: Path) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._command = [
            sys.executable,
            "-m",
            "segtxn.cli",
            *command,
            "--advertise",
            self.url,
            "--host",
            "127.0.0.1",
        ]
        self._log: IO[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process (again after :meth:`kill`: same port, same log)."""
        if self._log is None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(self._command, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        """Poll ``/readyz`` until it answers 200 (bounded)."""
        assert self.process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the {self.name} exited with {self.process.returncode}: {self.tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)  # process start-up: nothing to wait on but the port
        raise RuntimeError(
            f"the {self.name} was not ready within {READY_TIMEOUT_S:g} s: {self.tail()}"
        )

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone (a crash: nothing of it runs on)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def file_ledger_broker(port: int, ledger_dir: Path) -> BrokerServer:
    """A broker on the embedded metadata store with its ledgers in files under
    ``ledger_dir`` (``segtxn standalone`` keeps files only with etcd: the embedded store
    forgets them on restart, which a benchmark never does)."""
    from segtxn.broker.app import BrokerServer
    from segtxn.broker.settings import BrokerSettings

    return BrokerServer(
        BrokerSettings(
            broker_id="bench",
            advertise_url=f"http://127.0.0.1:{port}",
            store_url="memory://",
            ledger_url=f"file://{ledger_dir}",
        ),
        host="127.0.0.1",
        port=port,
    )


def collect_as_servers_do() -> None:
    """Set the garbage collector up as ``segtxn broker|coordinator|standalone`` do once
    their servers have started (:func:`segtxn.cli.lifecycle.serve`, design note 18): freeze
    what start-up left alive, collect the youngest generation less often. A ``--serve-*``
    process that skipped it measured a broker nobody runs: under bench/broker.py's load
    such a broker spent about a fifth of its CPU collecting (1.3 s of 6.7 s, a
    ``gc.callbacks`` timer), most of it in full collections of ~30 ms each."""
    from segtxn.cli import lifecycle

    lifecycle.freeze_start_up()
    lifecycle.collect_young_less_often()


async def until_signalled() -> None:
    """Return on SIGINT or SIGTERM (a ``--serve-*`` process's life)."""
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit, so the clean-up (servers, temporary directories) runs."""

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)


def percentile(samples: list[float], p: float) -> float:
    """Nearest-rank percentile (0 for no samples); sorted samples are sorted again cheaply."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def filesystem_of(path: Path) -> str:
    """``device on mountpoint type fstype`` for the mount holding ``path`` (best effort)."""
    best: tuple[str, str, str] | None = None
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                dev, mnt, fstype = fields[0], fields[1], fields[2]
                inside = str(path) == mnt or str(path).startswith(mnt.rstrip("/") + "/")
                if inside and (best is None or len(mnt) > len(best[1])):
                    best = (dev, mnt, fstype)
    except OSError:
        return "unknown filesystem"
    return "unknown filesystem" if best is None else f"{best[0]} on {best[1]} type {best[2]}"


def print_rows(rows: Sequence[Sequence[str]], left: int = 1) -> None:
    """Print ``rows`` (the first is the header) with the first ``left`` columns left-aligned."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for j, row in enumerate(rows):
        cells = [
            cell.ljust(widths[c]) if c < left else cell.rjust(widths[c])
            for c, cell in enumerate(row)
        ]
        print("  ".join(cells))
        if j == 0:
            print("  ".join("-" * w for w in widths))


PROPOSALS = "etcd_server_proposals_committed_total"


def store_writes(metrics_url: str | None) -> int:
    """etcd's committed raft proposals so far (0 without a URL): one per write request (a
    put, a delete, a multi-key transaction, a lease grant or revoke), whatever client sent
    it. ``metrics_url``: the member's ``http://<client endpoint>/metrics``."""
    if metrics_url is None:
        return 0
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(PROPOSALS + " "):
                return int(float(line.split()[1]))
    raise RuntimeError(f"{metrics_url} has no {PROPOSALS}")
