"""What the workload's clients record, and what they write into the topics.

Every client of a verification run appends JSON lines to its own history file
(``<run dir>/history/<client>.jsonl``), flushed line by line so a process killed with SIGKILL
leaves everything it recorded before the kill. One line is one event; ``kind`` tells which:

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

Input messages carry :class:`InputRecord` as their value, output messages
:class:`OutputRecord`: what the checker reads back from the topics.
"""

from __future__ import annotations

import time
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


class History:
    """One client's history file: append-only JSON lines, each flushed as it is written."""

    def __init__(self, directory: Path, client: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.client = client
        self.path = directory / f"{client}.jsonl"
        self._file: IO[bytes] = open(self.path, "ab")  # noqa: SIM115 - closed in close()

    def record(self, kind: str, **fields: Any) -> None:
        line = {"kind": kind, "client": self.client, "ts": time.time(), **fields}
        self._file.write(_encoder.encode(line) + b"\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class HistoryTail:
    """Follows history files that other processes are appending to: the orchestrator's view
    of what the processors are doing (who has a transaction open, how many commits were
    asked for). :meth:`poll` reads what was added since the last call."""

    def __init__(self, directory: Path, clients: list[str]) -> None:
        self._paths = {client: directory / f"{client}.jsonl" for client in clients}
        self._offsets = dict.fromkeys(clients, 0)
        self.open: dict[str, str | None] = dict.fromkeys(clients)
        """Each client's open transaction (begun, not ended), if any."""
        self.committing = 0
        """``committing`` events seen so far."""
        self.last_committing: tuple[str, str] | None = None
        """The client and transaction of the last one."""

    def poll(self) -> None:
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


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of one history file (a torn last line is skipped: a process killed
    mid-write)."""
    events: list[dict[str, Any]] = []
    for line in path.read_bytes().splitlines():
        try:
            events.append(msgspec.json.decode(line))
        except msgspec.DecodeError:
            continue
    return events
