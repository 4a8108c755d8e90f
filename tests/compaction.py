"""Crashes at each step of a compaction (segtxn/ledger/compacted.py), for the tests of every
log that is compacted: the coordinator's transaction log, the broker's snapshot and
pending-ack logs.

A step is cut by making it raise :class:`Killed`, before or after doing its work; then
:func:`kill` abandons the log the way SIGKILL would, and the test opens it again as the next
owner would, in a new process (a new storage object, nothing patched). Or the step really
SIGKILLs its process (:data:`die`), and the test opens the log the dead process left.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from segtxn.ledger import LogStorage
from segtxn.ledger.compacted import CompactedLog
from segtxn.ledger.logs import LOCAL, Placement


class Killed(BaseException):
    """The process died here (a BaseException: no handler on the way catches it)."""


def _raise_killed(where: str) -> None:
    raise Killed(where)


die: Callable[[str], None] = _raise_killed
"""What a cut step does: raise :class:`Killed` (in-process tests), or SIGKILL the process
(tests/coordinator/v4log_killer.py sets it)."""


async def kill(log: CompactedLog) -> None:
    """What SIGKILL leaves of a log: the files are released and no clean close is
    recorded. The entries queued when the step was cut are written first (one outcome a
    kill may have; an entry never queued is the other), so no write of this "dead"
    process lands after the next owner opened the files."""
    ledger = log.ledger
    await ledger._writer.idle.wait()
    await ledger._writer.close()
    await ledger._logs.close()


def stored_ledgers(storage: LogStorage, name: str) -> set[int]:
    """The ids of the log's ledgers that have files (or memory) in the storage."""
    return {i for i in range(1, 1000) if storage.exists(name, i)}


def cut_before(target: Any, name: str, *, skip: int = 0) -> None:
    """``target.name`` raises Killed instead of running, after ``skip`` calls that run."""
    original = getattr(target, name)
    calls = 0

    def cut(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > skip:
            die(f"killed before {name}")
        return original(*args, **kwargs)

    setattr(target, name, cut)


def cut_after(target: Any, name: str) -> None:
    """``target.name`` (a coroutine function) does its work, then raises Killed."""
    original = getattr(target, name)

    async def cut(*args: Any, **kwargs: Any) -> Any:
        await original(*args, **kwargs)
        die(f"killed after {name}")

    setattr(target, name, cut)


def cut_delete_after_first(storage: LogStorage) -> None:
    """The trim's first file deletion happens; the process dies before the next."""
    original = storage.delete
    calls = 0

    def cut(ledger_name: str, ledger_id: int, placement: Placement = LOCAL) -> None:
        nonlocal calls
        calls += 1
        if calls > 1:
            die("killed between two file deletions of a trim")
        original(ledger_name, ledger_id, placement)

    storage.delete = cut  # type: ignore[method-assign]


Step = Callable[[CompactedLog, LogStorage, int], None]
"""Cuts one step of the next compaction of a log (its storage; half of what it re-logs)."""

STEPS: dict[str, Step] = {
    "before the roll-over": lambda c, s, half: cut_before(c.ledger, "roll_over"),
    "after the roll-over": lambda c, s, half: cut_after(c.ledger, "roll_over"),
    "half-way through the re-log": lambda c, s, half: cut_before(c.ledger, "enqueue", skip=half),
    "before the properties": lambda c, s, half: cut_before(c.ledger, "update_properties"),
    "after the properties": lambda c, s, half: cut_after(c.ledger, "update_properties"),
    "before the cursor moves": lambda c, s, half: cut_before(c._cursor, "ack_cumulative"),
    "after the cursor moved": lambda c, s, half: cut_after(c._cursor, "ack_cumulative"),
    "before the trim": lambda c, s, half: cut_before(c.ledger, "trim"),
    "between the trim's metadata and its files": lambda c, s, half: cut_before(s, "delete"),
    "between two file deletions": lambda c, s, half: cut_delete_after_first(s),
}
WITHOUT_PROPERTIES = {"before the properties", "after the properties"}
"""Steps of a log whose compaction records no properties (they never happen)."""
CURSOR_MOVED = {
    "after the cursor moved",
    "before the trim",
    "between the trim's metadata and its files",
    "between two file deletions",
}
"""Steps after which the next owner replays from the cut."""
