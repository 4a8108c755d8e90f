"""What the workload's clients record, and what they write into the topics.

Every client of a verification run (the feeder, each processor, the orchestrator) records
its events in its history, one JSON object per event; ``kind`` tells which:

``sent`` (the feeder): an input message stored (acknowledged by the broker).
    ``{"kind": "sent", "client", "key", "seq", "id", "ts"}``
``received`` (a processor): an input message delivered to it.
    ``{"kind": "received", "client", "session", "key", "seq", "id", "ts"}``
``begin`` / ``committing`` / ``ended`` (a processor): one transaction's life.
    ``begin``: ``{"kind", "client", "session", "txn", "ts"}``;
    ``committing``: written just before the commit call (a transaction with no ``committing``
    line was never asked to commit, so nothing of it may ever be visible);
    ``ended``: ``{"kind", "client", "session", "txn", "ts", "outcome", "inputs", "outputs",
    "commit_ms"}`` with ``outcome`` one of :data:`Outcome`, ``inputs`` the ``{"key", "seq", "id"}``
    it consumed (acknowledged in it), ``outputs`` how many messages it sent, ``commit_ms`` the
    commit (or abort) call's duration.
``topology`` (the orchestrator): a split or merge. ``{"kind", "client", "ts", "topic", "op",
    "segments"}``.
``killed`` (the orchestrator): a processor, or a server, SIGKILLed. ``{"kind", "client",
    "ts", "victim", "txn"}`` (``txn``: the processor's open transaction, or for a server the
    transaction whose ``committing`` it was killed after, if any).
``fault`` (the orchestrator): one step of a fault (:mod:`segtxn.verify.faults`).
    ``{"kind", "client", "ts", "fault", "target", "step", "txn"}``; ``fault`` is a
    :class:`segtxn.verify.plan.FaultKind` value, ``step`` one of ``killed``, ``restarted``,
    ``stopped``, ``continued``, ``etcd-stopped``, ``etcd-started``.
``gauges`` (the orchestrator): about once a second while the run feeds and drains, what the
    brokers' stats say. ``{"kind", "client", "ts", "backlog", "fed", "active"}``: ``backlog``
    the inputs not yet consumed, ``fed`` the inputs stored so far, ``active`` each topic's
    active segments (``{"input": 2, "out-a": 3, "out-b": 1}``).

A processor's *session* is one process life (a restarted processor has a new session).
``id`` is a message id ``"segment@ledger:entry"``; ``txn`` is ``"most:least"``; ``ts`` is
wall-clock seconds (``time.time()``).

``run`` (the orchestrator, topics only, last): the run's :class:`~.workload.RunInfo`
    (``info``), what ``run.json`` holds for a run recorded in files.

Input messages carry :class:`InputRecord` as their value, output messages
:class:`OutputRecord`: what the checker reads back from the topics.

Where the histories are kept (:class:`HistoryStore`, the workload's ``--history``):

``files``: ``<run dir>/history/<client>.jsonl``, one line per event, written and flushed
    (to the OS) by :meth:`HistoryWriter.record` itself, so a process killed with SIGKILL keeps
    every event it recorded (at most a torn last line, which readers skip).
``topics``: the run's history topic ``topic://verify/<run>/history``
    (:mod:`.history_topic`), one message per event keyed by the client (so one client's
    events are in one segment, in the order recorded), sent without a transaction (never in
    a transaction under test). An event counts once the broker acknowledged it:
    :meth:`HistoryWriter.durable` returns when every event recorded so far has been. Of
    the events a SIGKILLed process recorded after its last ``durable()`` returned, some
    first ones may be stored, the rest are lost (none is ever stored twice or torn, none
    after one that is lost: one producer, one segment, in order). The processors call
    ``durable()`` after ``committing``, before the commit call (so a transaction with no
    ``committing`` was never asked to commit, as with files): a kill loses at most what was
    recorded since the last commit was asked for, the previous transaction's ``ended``
    included (an ``ended`` lost is a transaction whose outcome is unknown, which the
    checker never counts against the system).

Either way a history event missing from a run only makes the checker see less (an input
never ``sent``, a transaction never ``ended``); it never makes an anomaly.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import IO, Any, Literal

import msgspec

Outcome = Literal["committed", "aborted", "timed_out", "commit_failed"]
"""committed: commit returned; aborted: the processor aborted it on purpose; timed_out: it
stalled past its timeout and the commit was refused; commit_failed: commit raised otherwise
(the outcome is then whatever the coordinator decided: either is allowed)."""


class InputRecord(msgspec.Struct, frozen=True):
    """The value of an input message: the ``seq``-th message of ``key`` (0, 1, 2, ...)."""

    key: str
    seq: int


class OutputRecord(msgspec.Struct, frozen=True):
    """The value of an output message: derived from input (``in_key``, ``in_seq``, ``in_id``)
    by ``client`` in transaction ``txn``."""

    in_key: str
    in_seq: int
    in_id: str
    txn: str
    client: str


_encoder = msgspec.json.Encoder()


def encode(record: InputRecord | OutputRecord) -> bytes:
    return _encoder.encode(record)


def decode_input(data: bytes) -> InputRecord:
    return msgspec.json.decode(data, type=InputRecord)


class HistoryStore(enum.Enum):
    """Where a run's histories are kept (the workload's ``--history``)."""

    FILES = "files"
    TOPICS = "topics"


class HistoryError(Exception):
    """A history could not be recorded or read: the run's record is incomplete."""


class HistoryWriteFailed(HistoryError):
    """An event could not be stored (its history topic refused it, or the broker did not
    acknowledge it in time): the client stops rather than run on unrecorded."""


class HistoryBacklogFull(HistoryError):
    """More events are waiting for the broker than a history holds: the client records
    faster than the cluster stores, for longer than the backlog allows."""


def event_line(client: str, kind: str, fields: dict[str, Any]) -> bytes:
    """One event as the histories hold it (JSON, no newline); ``ts`` now unless given."""
    return _encoder.encode({"kind": kind, "client": client, "ts": time.time(), **fields})


class HistoryWriter(ABC):
    """One client's history: events recorded in order, each stored durably.

    :meth:`record` never waits on the network (a fault injector records while the broker it
    killed is down); :meth:`durable` waits until what was recorded is stored. A process killed
    loses at most what it recorded after its last :meth:`durable`."""

    client: str

    @abstractmethod
    def record(self, kind: str, **fields: Any) -> None:
        """Record one event after the ones before it.

        Raises:
            HistoryWriteFailed: an earlier event could not be stored.
            HistoryBacklogFull: too many events are waiting to be stored.
        """

    @abstractmethod
    async def durable(self) -> None:
        """Return once every event recorded so far is stored.

        Raises:
            HistoryWriteFailed: one could not be.
        """

    @abstractmethod
    async def close(self) -> None:
        """:meth:`durable`, then release what the history holds (also when that raises)."""


class FileHistory(HistoryWriter):
    """One client's history file: append-only JSON lines, each flushed as it is written, so
    an event is as durable as it gets once :meth:`record` returns."""

    def __init__(self, directory: Path, client: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.client = client
        self.path = directory / f"{client}.jsonl"
        self._file: IO[bytes] = open(self.path, "ab")  # noqa: SIM115 - closed in close()

    def record(self, kind: str, **fields: Any) -> None:
        self._file.write(event_line(self.client, kind, fields) + b"\n")
        self._file.flush()

    async def durable(self) -> None:
        """Every line is flushed as it is recorded: nothing to wait for."""

    async def close(self) -> None:
        self._file.close()


class HistoryTail(ABC):
    """Follows the histories other processes are recording: the orchestrator's view of what
    the processors are doing (who has a transaction open, how many commits were asked for).
    :meth:`poll` brings the view up to date."""

    def __init__(self, clients: list[str]) -> None:
        self.open: dict[str, str | None] = dict.fromkeys(clients)
        """Each client's open transaction (begun, not ended), if any."""
        self.committing = 0
        """``committing`` events seen so far."""
        self.last_committing: tuple[str, str] | None = None
        """The client and transaction of the last one."""

    @abstractmethod
    async def poll(self) -> None:
        """Take in what was recorded since the last call.

        Raises:
            HistoryError: the histories cannot be followed any more.
        """

    @abstractmethod
    async def close(self) -> None:
        """Stop following."""

    def apply(self, client: str, event: dict[str, Any]) -> None:
        """Take in one event of ``client`` (one the tail does not follow is ignored)."""
        if client not in self.open:
            return
        kind = event.get("kind")
        if kind == "begin":
            self.open[client] = event.get("txn")
        elif kind == "ended" and event.get("txn") == self.open[client]:
            self.open[client] = None
        elif kind == "committing":
            self.committing += 1
            self.last_committing = (client, str(event.get("txn")))

    def forget(self, client: str) -> None:
        """``client`` was killed: what it had open will never end in its history."""
        self.open[client] = None


class FileTail(HistoryTail):
    """Follows history files: each :meth:`poll` reads what was appended since the last."""

    def __init__(self, directory: Path, clients: list[str]) -> None:
        super().__init__(clients)
        self._paths = {client: directory / f"{client}.jsonl" for client in clients}
        self._offsets = dict.fromkeys(clients, 0)

    async def poll(self) -> None:
        self._read()  # small appends to local files: not worth a thread

    async def close(self) -> None:
        """Nothing is held open between polls."""

    def _read(self) -> None:
        for client, path in self._paths.items():
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets[client])
                    data = f.read()
            except FileNotFoundError:
                continue
            complete = data[: data.rfind(b"\n") + 1]  # a line being written waits its turn
            self._offsets[client] += len(complete)
            for line in complete.splitlines():
                try:
                    event = msgspec.json.decode(line)
                except msgspec.DecodeError:
                    continue  # torn by a SIGKILL, and then appended to by the next incarnation
                self.apply(client, event)
