"""The peer benchmark's helpers (``bench/peer.py``): what a row is and what one run of it
measured, CPU time of processes from ``/proc``, a private RabbitMQ node, and the
consume-transform-produce loop against it through ``aio-pika``.

The RabbitMQ node is Debian's ``rabbitmq-server`` (3.10 on bookworm), started from its real
start script (``/usr/lib/rabbitmq/bin/rabbitmq-server``: the ``/usr/sbin`` wrapper would
``su rabbitmq``, which cannot write a private directory) with everything in one directory:
node name ``segtxn-bench-<pid>@localhost``, AMQP on a free loopback port, the Erlang
distribution on another, a private ``epmd`` on a third (``ERL_EPMD_PORT``; killed at the
end), data (``RABBITMQ_MNESIA_BASE``), logs, an empty plugin list (no management plugin),
and no system config or env file. It is ready when an AMQP connection succeeds (bounded
wait). Its schedulers do not busy-wait (``+sbwt none``...): on a shared 2-core machine
spinning schedulers would take the cores the client needs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from segtxn.metastore.etcd_server import free_port

SIZE = 100
"""Bytes per message, inputs and outputs alike."""
RECEIVE_TIMEOUT_S = 30.0
RABBIT_READY_TIMEOUT_S = 90.0
RABBIT_STOP_TIMEOUT_S = 30.0
PREFILL_CHUNK = 500
INSTALL_HINT = (
    "RabbitMQ is not installed (no rabbitmq-server on PATH): only the segtxn rows run. "
    "To compare, install it (Debian/Ubuntu: `sudo apt-get install -y rabbitmq-server`; the "
    "benchmark starts its own node, the system service is not needed) and run again."
)


@dataclass(frozen=True)
class Row:
    """One kind of loop: ``plain`` (at-least-once: sends confirmed, then inputs acked),
    ``txn`` (one transaction per batch of ``size``), ``txn2`` (segtxn's, ended by END_TXN
    after the op records: ``--two-step``) or ``txnp`` (segtxn's, pipelined: each batch
    commits while the next is worked on, ``client.transaction(after=...)``:
    ``--pipelined``)."""

    transactional: bool
    size: int
    two_step: bool = False
    """segtxn only: END_TXN after the op records, not the broker's one-step commit."""
    pipelined: bool = False
    """segtxn only: the next batch's transaction follows this one's, which commits
    meanwhile (AMQP channel transactions have no such thing: a channel's ``tx_commit``
    ends one before the next begins)."""

    @property
    def segtxn_only(self) -> bool:
        return self.two_step or self.pipelined

    @property
    def label(self) -> str:
        kind = (
            "txn2"
            if self.two_step
            else "txnp"
            if self.pipelined
            else "txn"
            if self.transactional
            else "plain"
        )
        return f"{kind} {self.size}"


@dataclass
class Sample:
    """One run of a row against one system: the measured window (after one warm-up batch)."""

    system: str
    row: Row
    round: int = 0
    error: str | None = None
    """Why the run failed (its figures are then missing from the tables)."""
    messages: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    """Per batch: from starting to receive its inputs to its outputs and acks settled."""
    commits: list[float] = field(default_factory=list)
    """Per transactional batch: the commit call alone (its sends and acks were settled)."""
    ran_out: bool = False
    """The pre-filled input ran out before ``--seconds`` (the rate is still valid)."""
    server_cpu: float = 0.0
    other_cpu: float = 0.0
    """segtxn: coordinator and etcd processes (RabbitMQ is one process tree)."""
    client_cpu: float = 0.0
    store_writes: int = 0
    """segtxn on etcd: write requests the store committed in the window."""

    @property
    def rate(self) -> float:
        return self.messages / self.elapsed if self.elapsed else 0.0


def payload(i: int) -> bytes:
    return (b"%010d" % i).ljust(SIZE, b"x")


def transform(value: bytes) -> bytes:
    return value.upper()


# ---------------------------------------------------------------------- CPU from /proc


_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from 3 (state) on


def tree_cpu(root: int | None) -> float:
    """User + system CPU seconds of ``root`` and its live descendants (0 without it)."""
    if root is None:
        return 0.0
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = int(fields[1])
            stats[int(entry.name)] = fields
    total = 0.0
    for pid, fields in stats.items():
        p = pid
        while p not in (root, 0, 1) and p in parents:
            p = parents[p]
        if p == root:
            total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


class Meter:
    """CPU seconds of server process trees and of this process over a window."""

    def __init__(self, server: int | None, others: list[int | None]) -> None:
        self._server, self._others = server, others
        self._start = self._read()

    def _read(self) -> tuple[float, float, float]:
        others = sum(tree_cpu(p) for p in self._others)
        return tree_cpu(self._server), others, time.process_time()

    def stop(self, sample: Sample) -> None:
        end = self._read()
        sample.server_cpu, sample.other_cpu, sample.client_cpu = (
            e - s for e, s in zip(end, self._start, strict=True)
        )


# ---------------------------------------------------------------------- the RabbitMQ node


def rabbitmq_script() -> Path | None:
    """The real start script behind ``rabbitmq-server`` on PATH (None: not installed)."""
    found = shutil.which("rabbitmq-server") or shutil.which(
        "rabbitmq-server", path="/usr/sbin:/usr/local/sbin:/usr/lib/rabbitmq/bin"
    )
    if found is None:
        return None
    real = Path(found).resolve()
    if real.name == "rabbitmq-script-wrapper":  # Debian's: su rabbitmq, logs in /var/log
        real = real.parent / "rabbitmq-server"
    return real


@dataclass
class RabbitNode:
    url: str
    pid: int
    log: Path


@contextmanager
def rabbitmq_node(script: Path, directory: Path) -> Iterator[RabbitNode]:
    """Start a private node in ``directory``; yield once it accepts AMQP; stop it (SIGTERM,
    which the start script turns into a clean shutdown; SIGKILL to its session after
    ``RABBIT_STOP_TIMEOUT_S``) and its epmd, whatever happens in between."""
    directory.mkdir(parents=True, exist_ok=True)
    port, dist, epmd = free_port(), free_port(), free_port()
    (directory / "enabled_plugins").write_text("[].\n")
    (directory / "rabbitmq.conf").write_text(
        f"listeners.tcp.1 = 127.0.0.1:{port}\nlog.file.level = warning\n"
    )
    env = {
        **os.environ,
        "HOME": str(directory),  # the Erlang cookie
        "RABBITMQ_NODENAME": f"segtxn-bench-{os.getpid()}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist),
        "ERL_EPMD_PORT": str(epmd),
        "RABBITMQ_BASE": str(directory),
        "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"),
        "RABBITMQ_LOG_BASE": str(directory / "log"),
        "RABBITMQ_PLUGINS_EXPAND_DIR": str(directory / "plugins-expand"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(directory / "rabbitmq.conf"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(directory / "advanced.config"),
        "RABBITMQ_CONF_ENV_FILE": str(directory / "rabbitmq-env.conf"),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "+sbwt none +sbwtdcpu none +sbwtdio none",
    }
    log_path = directory / "node.log"
    log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed below
    # its own session: Ctrl-C reaches this process only, which then stops the node
    process = subprocess.Popen(
        [str(script)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        url = f"amqp://guest:guest@127.0.0.1:{port}/"
        asyncio.run(_wait_amqp(url, process, log_path))
        yield RabbitNode(url, process.pid, log_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=RABBIT_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        with suppress(ProcessLookupError):  # anything left in its session (not epmd: below)
            os.killpg(process.pid, signal.SIGKILL)
        epmd_bin = shutil.which("epmd")
        if epmd_bin is not None:
            subprocess.run(
                [epmd_bin, "-kill"],
                env={**os.environ, "ERL_EPMD_PORT": str(epmd)},
                capture_output=True,
                timeout=10,
                check=False,
            )
        log.close()


def _tail(path: Path, lines: int = 15) -> str:
    with suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


async def _wait_amqp(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    logging.getLogger("aiormq.connection").setLevel(logging.CRITICAL)  # refused, until up
    deadline = time.monotonic() + RABBIT_READY_TIMEOUT_S
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"rabbitmq-server exited with {process.returncode}: {_tail(log)}")
        try:
            connection = await aio_pika.connect(url, timeout=2)
        except (TimeoutError, OSError, aio_pika.AMQPException) as e:
            last = e
            await asyncio.sleep(0.2)  # the node boots: nothing to wait on but the port
            continue
        await connection.close()
        return
    raise RuntimeError(
        f"RabbitMQ did not accept AMQP within {RABBIT_READY_TIMEOUT_S:g} s ({last!r}): {_tail(log)}"
    )


# ---------------------------------------------------------------------- the RabbitMQ loop


async def rabbitmq_row(
    node: RabbitNode, name: str, row: Row, prefill: int, seconds: float
) -> Sample:
    """Fresh durable queues ``name-in`` (pre-filled with ``prefill`` persistent messages)
    and ``name-out``; one consumer, prefetch max(1000, 2 * size) (segtxn's receiver queue
    holds 1000). ``plain``: a channel with publisher confirms; per batch the outputs are
    published (all confirms awaited together), then the inputs acked (one ``multiple``
    ack). ``txn``: a channel in ``tx_select`` mode; per batch the publishes and the ack,
    then ``tx_commit`` (the commit covers both)."""
    sample = Sample("RabbitMQ", row)
    connection = await aio_pika.connect(node.url)
    try:
        filler = await connection.channel(publisher_confirms=True)
        source = await filler.declare_queue(f"{name}-in", durable=True)
        await filler.declare_queue(f"{name}-out", durable=True)
        for first in range(0, prefill, PREFILL_CHUNK):
            await asyncio.gather(
                *(
                    filler.default_exchange.publish(_persistent(payload(i)), f"{name}-in")
                    for i in range(first, min(prefill, first + PREFILL_CHUNK))
                )
            )
        channel = await connection.channel(publisher_confirms=not row.transactional)
        await channel.set_qos(prefetch_count=max(1000, 2 * row.size))
        tx = channel.transaction() if row.transactional else None
        if tx is not None:
            await tx.select()
        inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        queue = await channel.get_queue(source.name)
        tag = await queue.consume(inbox.put, no_ack=False)
        exchange = channel.default_exchange
        meter: Meter | None = None
        consumed, start = 0, 0.0
        while consumed + row.size <= prefill:
            t0 = time.perf_counter()
            inputs = [
                await asyncio.wait_for(inbox.get(), RECEIVE_TIMEOUT_S) for _ in range(row.size)
            ]
            outputs = [_persistent(transform(m.body)) for m in inputs]
            if tx is None:
                await asyncio.gather(*(exchange.publish(o, f"{name}-out") for o in outputs))
                await inputs[-1].ack(multiple=True)
            else:
                for o in outputs:
                    await exchange.publish(o, f"{name}-out")
                await inputs[-1].ack(multiple=True)
                committing = time.perf_counter()
                await tx.commit()
            now = time.perf_counter()
            consumed += row.size
            if meter is None:  # the warm-up batch ends: the window starts
                meter, start = Meter(node.pid, []), now
                continue
            sample.latencies.append(now - t0)
            if tx is not None:
                sample.commits.append(now - committing)
            sample.messages += row.size
            if now - start >= seconds:
                break
        else:
            sample.ran_out = True
        sample.elapsed = time.perf_counter() - start
        if meter is not None:
            meter.stop(sample)
        await queue.cancel(tag)
        await filler.queue_delete(f"{name}-in")
        await filler.queue_delete(f"{name}-out")
    finally:
        await connection.close()
    return sample


def _persistent(body: bytes) -> aio_pika.Message:
    return aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
