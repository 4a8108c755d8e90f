"""Injecting a run's faults into the running workload, at their moments.

A fault in a plan (:class:`segtxn.verify.plan.Fault`) has a time (a fraction of the feed) and
then waits for the moment that makes it bite:

- ``kill-processor``: the victim has a transaction open (up to 2 s), then SIGKILL, and it
  starts again under its name (its segments wait for it);
- ``stop-processor``: the victim has a transaction open, then SIGSTOP for ``hold_s`` (past
  its transaction timeout: the coordinator aborts it), then SIGCONT: a zombie that wakes up
  and tries to commit, and must be refused;
- ``kill-server``: a processor has just written ``committing`` (its END_TXN is being
  materialized), then SIGKILL the server, wait ``hold_s``, restart it on its data dir and
  port;
- ``wipe-server`` (replicated clusters): as ``kill-server``, and its data directory is
  emptied before the restart (it comes back a new storage instance);
- ``stop-server`` (replicated clusters): as ``kill-server`` waits, then SIGSTOP the server
  for ``hold_s`` (often past its session: its topics move), then SIGCONT;
- ``restart-etcd``: stop the private etcd, wait ``hold_s``, start it on the same data dir.

Faults run one after another (a late one starts at once), each step recorded in the
orchestrator's history (``fault`` and ``killed`` events, :mod:`segtxn.verify.history`). The
servers are reached through :class:`Servers` (the run's :class:`segtxn.verify.cluster.Cluster`).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from segtxn.verify.history import HistoryTail, HistoryWriter
from segtxn.verify.plan import Fault, FaultKind
from segtxn.verify.processes import ManagedProcess


class Servers(Protocol):
    """What a fault does to the cluster's servers and store (and how the run asks the
    servers for their stacks when it does not drain)."""

    async def kill_server(self, name: str, why: str = "") -> None: ...

    async def restart_server(self, name: str, why: str = "restart") -> None: ...

    def wipe_server(self, name: str) -> None: ...

    def signal_server(self, name: str, sig: signal.Signals, why: str) -> None: ...

    async def stop_etcd(self) -> None: ...

    async def start_etcd(self) -> None: ...

    async def dump_stacks(self) -> None: ...


@dataclass
class FaultContext:
    processors: dict[str, ManagedProcess]
    history: HistoryWriter
    tail: HistoryTail
    feed_s: float
    servers: Servers | None
    progress: Callable[[str], None]


def check_faults(faults: Sequence[Fault], processors: Sequence[str], servers: bool) -> None:
    """Raises ValueError for a fault this run cannot inject."""
    for fault in faults:
        if fault.kind in (FaultKind.KILL_PROCESSOR, FaultKind.STOP_PROCESSOR):
            if fault.target not in processors:
                raise ValueError(f"{fault.describe()}: no processor {fault.target}")
        elif not servers:
            raise ValueError(f"{fault.describe()}: this run has no servers it may restart")


async def run_faults(faults: Sequence[Fault], ctx: FaultContext) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    for fault in sorted(faults, key=lambda f: f.at):
        at = start + fault.at * ctx.feed_s
        await asyncio.sleep(max(0.0, at - loop.time()))  # sleep-ok: the fault's time
        ctx.progress(f"  fault {fault.describe()}")
        if fault.kind is FaultKind.KILL_PROCESSOR:
            await _kill_processor(fault, ctx)
        elif fault.kind is FaultKind.STOP_PROCESSOR:
            await _stop_processor(fault, ctx)
        elif fault.kind in (FaultKind.KILL_SERVER, FaultKind.WIPE_SERVER):
            await _kill_server(fault, ctx)
        elif fault.kind is FaultKind.STOP_SERVER:
            await _stop_server(fault, ctx)
        else:
            await _restart_etcd(fault, ctx)


async def wait_for_open_transaction(
    tail: HistoryTail, client: str | None, limit_s: float
) -> str | None:
    """Up to ``limit_s`` for ``client`` (or any processor) to have a transaction open; its
    name (None: none in time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        await tail.poll()
        open_txns = [t for c, t in tail.open.items() if t is not None and client in (None, c)]
        if open_txns or loop.time() >= deadline:
            return open_txns[0] if open_txns else None
        await asyncio.sleep(0.01)  # sleep-ok: polling what other processes record


async def _kill_processor(fault: Fault, ctx: FaultContext) -> None:
    victim = ctx.processors[fault.target]
    txn = await wait_for_open_transaction(ctx.tail, victim.name, 2.0)
    await victim.kill(f"fault {fault.describe()}, in transaction {txn}")
    ctx.tail.forget(victim.name)
    ctx.history.record("killed", victim=victim.name, txn=txn)
    await victim.start(f"restart after SIGKILL ({fault.describe()})")
    ctx.history.record("fault", fault=fault.kind.value, target=victim.name, step="restarted")


async def _stop_processor(fault: Fault, ctx: FaultContext) -> None:
    victim = ctx.processors[fault.target]
    txn = await wait_for_open_transaction(ctx.tail, victim.name, 2.0)
    victim.send(signal.SIGSTOP)
    victim.note(f"SIGSTOP for {fault.hold_s:g} s ({fault.describe()}, in transaction {txn})")
    ctx.history.record("fault", fault=fault.kind.value, target=victim.name, step="stopped", txn=txn)
    try:
        await asyncio.sleep(fault.hold_s)  # sleep-ok: the stop lasts past the txn timeout
    finally:
        victim.send(signal.SIGCONT)
        victim.note("SIGCONT")
    ctx.history.record("fault", fault=fault.kind.value, target=victim.name, step="continued")


async def _next_commit(ctx: FaultContext) -> tuple[str | None, str]:
    """Up to 5 s for a processor's next ``committing`` event: its transaction, and where
    the fault strikes (for the logs)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    await ctx.tail.poll()
    seen = ctx.tail.committing
    while ctx.tail.committing == seen and loop.time() < deadline:
        await asyncio.sleep(0.005)  # sleep-ok: polling what other processes record
        await ctx.tail.poll()
    committing = ctx.tail.last_committing if ctx.tail.committing > seen else None
    txn = None if committing is None else committing[1]
    where = "no commit seen in 5 s" if committing is None else f"after {committing} committing"
    return txn, where


async def _kill_server(fault: Fault, ctx: FaultContext) -> None:
    assert ctx.servers is not None  # check_faults
    txn, where = await _next_commit(ctx)
    await ctx.servers.kill_server(fault.target, f"fault {fault.describe()}, {where}")
    ctx.history.record("killed", victim=fault.target, txn=txn)
    ctx.history.record("fault", fault=fault.kind.value, target=fault.target, step="killed", txn=txn)
    if fault.kind is FaultKind.WIPE_SERVER:
        ctx.servers.wipe_server(fault.target)
        ctx.history.record("fault", fault=fault.kind.value, target=fault.target, step="wiped")
    await asyncio.sleep(fault.hold_s)  # sleep-ok: the server's downtime
    await ctx.servers.restart_server(fault.target, f"restart after SIGKILL ({fault.describe()})")
    ctx.history.record("fault", fault=fault.kind.value, target=fault.target, step="restarted")


async def _stop_server(fault: Fault, ctx: FaultContext) -> None:
    assert ctx.servers is not None  # check_faults
    txn, where = await _next_commit(ctx)
    target, kind = fault.target, fault.kind.value
    ctx.servers.signal_server(
        target, signal.SIGSTOP, f"SIGSTOP for {fault.hold_s:g} s ({fault.describe()}, {where})"
    )
    ctx.history.record("fault", fault=kind, target=target, step="stopped", txn=txn)
    try:
        await asyncio.sleep(fault.hold_s)  # sleep-ok: the pause lasts (often past its session)
    finally:
        ctx.servers.signal_server(target, signal.SIGCONT, "SIGCONT")
    ctx.history.record("fault", fault=kind, target=target, step="continued")


async def _restart_etcd(fault: Fault, ctx: FaultContext) -> None:
    assert ctx.servers is not None  # check_faults
    await ctx.servers.stop_etcd()
    ctx.history.record("fault", fault=fault.kind.value, target="etcd", step="etcd-stopped")
    try:
        await asyncio.sleep(fault.hold_s)  # sleep-ok: etcd's downtime
    finally:
        await ctx.servers.start_etcd()
    ctx.history.record("fault", fault=fault.kind.value, target="etcd", step="etcd-started")
