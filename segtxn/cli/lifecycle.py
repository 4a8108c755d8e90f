"""Running servers until a signal: a start-up that fails fast and says why, and a shutdown
that ends in bounded time.

``segtxn broker``, ``coordinator`` and ``standalone`` all run through :func:`serve`. Before,
a broker whose etcd did not answer printed nothing, never exited, and ignored SIGTERM: its
start-up waited forever and the signal handler only set an event nobody waited on yet
(issue 15). Here:

- SIGTERM and SIGINT are handled from the moment the command starts (before the event loop
  runs they raise :class:`Interrupted`). During start-up they cancel it (each server closes
  what it had opened); while serving they begin the shutdown. A second signal ends the
  process at once (exit 1); the first one repeated within :data:`REPEATED_S` is not one.
  The handlers found are put back when the command ends (one run in the caller's process,
  a test's ``CliRunner``, leaves the caller's in place).
- Each server reaches its store with bounded retries (``--store-timeout``; the servers do it
  themselves, :func:`segtxn.metastore.wait_reachable`). A server that cannot start (store
  unreachable, port taken, data directory not writable, broker id held by a live broker)
  raises :class:`StartupFailed`, which names it and the reason; what was started is closed
  first.
- The shutdown closes the servers in reverse order, saying each on stderr, within
  ``--shutdown-timeout`` altogether; past it, :class:`ShutdownTimedOut`.
- Once every server has started, what start-up left alive is frozen out of the garbage
  collector's reach (:func:`freeze_start_up`), and the youngest generation is collected
  less often (:func:`collect_young_less_often`).

A stop asked for by a signal is a clean exit (status 0), at any point.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator

from segtxn.broker.app import BrokerServer
from segtxn.broker.registration import BrokerIdTaken
from segtxn.cli.errors import Interrupted, ServeError
from segtxn.coordinator.app import CoordinatorServer
from segtxn.ledger import LedgerError
from segtxn.metastore import MetadataStoreError

log = logging.getLogger(__name__)

Server = BrokerServer | CoordinatorServer
Say = Callable[[str], None]


class StartupFailed(ServeError):
    """A server could not start; the message names it and the reason."""


class ShutdownTimedOut(ServeError):
    """The servers did not all stop within the shutdown timeout; the process exits anyway."""


def name_of(server: Server) -> str:
    if isinstance(server, BrokerServer):
        return f"broker {server.settings.broker_id}"
    return f"coordinator {server.settings.advertise_url}"


def describe(server: Server) -> str:
    if isinstance(server, BrokerServer):
        s = server.settings
        ledgers = "in memory, lost on exit" if s.ledger_url == "memory://" else s.ledger_url
        where = f"store {s.store_url}, ledgers {ledgers}"
        return f"broker {s.broker_id} on {s.advertise_url} ({where})"
    s2 = server.settings
    return f"transaction coordinator on {s2.advertise_url} (store {s2.store_url})"


def _reason(server: Server, e: BaseException) -> str:
    if isinstance(e, BrokerIdTaken):
        return str(e)
    if isinstance(e, MetadataStoreError):
        return f"metadata store {server.settings.store_url}: {type(e).__name__}: {e}"
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.strerror}: {e.filename}"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"{type(e).__name__}: {e}"


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(signal.Signals(signum))


@contextlib.contextmanager
def catch_signals_early() -> Iterator[None]:
    """Within it, until the server's event loop handles them (:func:`serve`, or Kopf's),
    SIGTERM and SIGINT raise :class:`Interrupted` where the process is, instead of killing
    it: a stop asked for while it parses flags or sets its loop up is still a clean one.

    The handlers it found are put back on the way out, however the command ends: a server
    command run in the caller's process (a test's ``CliRunner``, a program embedding the
    CLI) left its own installed before (and, after :func:`serve`, the ones asyncio's loop
    puts back, Python's defaults), and a later signal raised :class:`Interrupted` wherever
    the caller was, or killed it."""
    signals = (signal.SIGINT, signal.SIGTERM)
    found = {sig: signal.signal(sig, _interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in found.items():
            signal.signal(sig, handler)


REPEATED_S = 0.1
"""A signal of the kind received first, within this long of it, is the same delivery
repeated, not a second: GNU ``timeout`` (and supervisors like it) send a signal it gets to
its child and then to the child's whole process group, so ``timeout 60 segtxn standalone``
stopped by SIGINT saw two, and exited without its clean shutdown. A person pressing Ctrl-C
twice takes longer than this."""


class _Signals:
    """SIGINT and SIGTERM on the running loop: the first sets :attr:`received`; a second
    (the shutdown is taking too long for whoever sends it) exits the process at once."""

    def __init__(self, say: Say) -> None:
        self.received = asyncio.Event()
        self.name = ""
        self._say = say
        self._loop = asyncio.get_running_loop()
        self._first_at = 0.0
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._loop.add_signal_handler(sig, self._on, sig)

    def _on(self, sig: signal.Signals) -> None:
        if self.received.is_set():
            if sig.name == self.name and self._loop.time() - self._first_at < REPEATED_S:
                return  # the first one, repeated to the process group (REPEATED_S)
            self._say(f"second {sig.name}: exiting without finishing the shutdown")
            sys.stderr.flush()
            os._exit(1)
        self.name = sig.name
        self._first_at = self._loop.time()
        self.received.set()

    def remove(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._loop.remove_signal_handler(sig)


async def _start(servers: list[Server], opened: list[Server], say: Say) -> None:
    for server in servers:
        opened.append(server)  # stop() is safe after a failed or interrupted start
        try:
            await server.start()
        except (MetadataStoreError, LedgerError, OSError, BrokerIdTaken) as e:
            raise StartupFailed(f"{name_of(server)} could not start: {_reason(server, e)}") from e
        say(f"serving: {describe(server)}")


def freeze_start_up() -> int:
    """Collect start-up's garbage, then move every object still alive into the collector's
    permanent generation; returns how many were frozen.

    A server's heap after start-up is mostly permanent (modules, classes, aiohttp's and
    gRPC's tables, the servers' own state), and every full collection walked all of it: a
    broker under load paused about 50 ms for each (about 110,000 objects), every few
    seconds, on top of each message's latency. Frozen, they are no longer examined; a full
    collection then walks what the servers allocated since (12 ms in the same run, see
    docs/design-notes.md). The collection first is what keeps start-up's garbage cycles
    from being frozen, that is leaked, with the rest."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


YOUNG_COLLECTION_EVERY = 10_000
"""Container objects allocated (net of those freed) between two collections of the youngest
generation; CPython's default is 700."""


def collect_young_less_often() -> None:
    """Collect the youngest generation every :data:`YOUNG_COLLECTION_EVERY` allocations.

    A server's objects mostly live for one message or one batch and are freed by their
    reference counts; at CPython's default of 700 a collection comes while many of them are
    still in flight, moves them to an older generation, and every few such moves start a
    full collection. A broker under the loops of bench/peer.py made 1,795 young and 15
    full collections for 2.1-2.3 s of collecting; at 10,000, 58 and 1, for 0.5-0.9 s
    (docs/design-notes.md, note 18). Garbage in reference cycles waits a little longer to
    be freed; nothing else changes."""
    gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])


async def _first(task: asyncio.Task[None], event: asyncio.Event) -> bool:
    """Wait for ``task`` to end or ``event`` to be set; True when the task ended first."""
    waiter = asyncio.create_task(event.wait(), name="wait-for-signal")
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
    return task.done()


async def _stop(opened: list[Server], deadline: float, timeout_s: float, say: Say) -> None:
    """Stop ``opened`` in reverse order by ``deadline`` (loop time; ``timeout_s`` after the
    shutdown began).

    Raises:
        ShutdownTimedOut: a server was still stopping when the time was up.
    """
    loop = asyncio.get_running_loop()
    for server in reversed(opened):
        started = loop.time()
        try:
            async with asyncio.timeout_at(deadline):
                await server.stop()
        except TimeoutError:
            raise ShutdownTimedOut(
                f"{name_of(server)} did not stop within the shutdown timeout "
                f"({timeout_s:g} s); exiting without finishing"
            ) from None
        except (MetadataStoreError, LedgerError, OSError) as e:
            say(f"closing {name_of(server)} failed: {_reason(server, e)}")
            continue
        say(f"closed {name_of(server)} in {loop.time() - started:.1f} s")


async def serve(make: Callable[[], list[Server]], *, shutdown_timeout_s: float, say: Say) -> None:
    """Start the servers ``make`` returns, serve until SIGINT or SIGTERM, stop them.

    Raises:
        StartupFailed: a server could not start (what had started was stopped).
        ShutdownTimedOut: the shutdown took longer than ``shutdown_timeout_s``.
    """
    loop = asyncio.get_running_loop()
    signals = _Signals(say)
    opened: list[Server] = []
    report = say
    deadline: float | None = None
    try:
        start = asyncio.create_task(_start(make(), opened, say), name="server-start-up")
        if await _first(start, signals.received):
            if start.exception() is not None:
                report = log.info  # the error is the one line to see; the rest is in the log
            start.result()  # StartupFailed: the finally stops what had started
            log.info("froze %d start-up objects out of the collector's reach", freeze_start_up())
            collect_young_less_often()
            await signals.received.wait()
            say(f"{signals.name}: stopping the servers")
        else:
            say(f"{signals.name} while starting: stopping")
            deadline = loop.time() + shutdown_timeout_s
            start.cancel()
            try:
                async with asyncio.timeout_at(deadline):
                    await asyncio.gather(start, return_exceptions=True)
            except TimeoutError:
                raise ShutdownTimedOut(
                    f"the start-up did not end within the shutdown timeout "
                    f"({shutdown_timeout_s:g} s); exiting without finishing"
                ) from None
    finally:
        try:
            deadline = deadline or loop.time() + shutdown_timeout_s
            await _stop(opened, deadline, shutdown_timeout_s, report)
        finally:
            signals.remove()
