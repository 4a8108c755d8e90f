"""Server processes for the benchmarks: ``python -m segtxn.cli <command>`` on a free loopback
port, logging to a file, ready when ``/readyz`` answers, stopped with SIGTERM (then SIGKILL)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from segtxn.metastore.etcd_server import free_port

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
