"""The managed ledger's error tree."""

from __future__ import annotations

import contextlib
import errno
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Iterator

from segtxn.metastore import MetadataStoreError

log = logging.getLogger(__name__)


class LedgerError(Exception):
    """Base of every managed-ledger error."""

    retriable: bool = False


class LedgerSealed(LedgerError):
    """The ledger is terminated (sealed): it accepts no more appends. Reads still work."""


class LedgerClosed(LedgerError):
    """The ledger object was closed by its owner."""


class LedgerCorrupted(LedgerError):
    """Stored data is damaged where a crash cannot explain it (not a torn, unacknowledged
    tail): a record fails its checksum, a file is shorter than what was acknowledged, a
    header is gone.

    Nothing at or after the damage is served or truncated away; an operator has to
    restore the data. ``path`` names the file (None for storage without files).
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


def again(error: LedgerCorrupted) -> LedgerCorrupted:
    """A new error equal to ``error`` (found earlier): the same class, message and
    attributes (a ``LedgerMismatch``'s nonces, a ``LedgerMissing``'s paths), so that a
    refusal repeated is caught as it was the first time. (Not ``error`` itself: each
    raise of one exception object adds to its traceback, and concurrent readers would
    share it.)"""
    fresh = type(error).__new__(type(error), *error.args)
    fresh.__dict__.update(error.__dict__)
    return fresh


def reworded(error: LedgerCorrupted, message: str) -> LedgerCorrupted:
    """``error`` told as ``message`` (which says what needed the data, and quotes
    ``error``): the same class and attributes, so that it is counted and refused as
    ``error`` would be."""
    fresh = type(error).__new__(type(error), message)
    fresh.__dict__.update(error.__dict__)
    return fresh


class LedgerMissing(LedgerCorrupted):
    """A ledger the metadata store names has no file: the data directory is empty or is
    not this ledger's (a wrong or lost volume). The ledger is refused, never recreated
    empty. ``paths`` names every missing file."""

    def __init__(self, message: str, *, paths: tuple[str, ...]) -> None:
        super().__init__(message, path=paths[0] if paths else None)
        self.paths = paths


class LedgerMismatch(LedgerCorrupted):
    """A ledger's file is not the one its metadata names: the nonce in its header (random,
    written when the file was created) is not the one recorded in the ledger's
    ``LedgerInfo`` then. The data directory is another cluster's, or a restored copy of
    another incarnation of the topic (deleted and made again under the same name), whose
    files have the same names, counts and sizes. Its entries are never served, and the
    file is left as it is (never truncated, never deleted): mount the right volume or
    restore the right files. ``recorded`` and ``found`` are the two nonces."""

    def __init__(self, message: str, *, path: str, recorded: int, found: int) -> None:
        super().__init__(message, path=path)
        self.recorded = recorded
        self.found = found


class CursorDamaged(LedgerCorrupted):
    """A cursor's record in the metadata store does not read (not JSON, another shape, a
    range that is not four numbers): written by hand, by another version of segtxn, or
    damaged. The ledger is refused rather than opened without it (its subscription would
    start again elsewhere, skipping or repeating what it had acknowledged). The message
    names the ledger, the cursor, the record's ``key``, what is wrong (``reason``) and how
    to repair it (:mod:`segtxn.ledger.cursor_repair`: the subscription starts again at the
    first retained entry, nothing lost; ``segtxn topics repair-cursor``)."""

    def __init__(self, ledger: str, cursor: str, key: str, reason: str) -> None:
        super().__init__(
            f"{ledger}: the record of its cursor {cursor!r} at {key} in the metadata store "
            f"does not read ({reason}): it was written by hand, by another version of "
            "segtxn, or damaged; repair it (a topic's subscription: `segtxn topics "
            "repair-cursor TOPIC SUBSCRIPTION`, which starts it again at the first retained "
            "entry: nothing is lost)"
        )
        self.key = key
        self.cursor = cursor
        self.reason = reason


REPORTED_LIMIT = 256
"""How many refusals :func:`report_once` remembers: a few hundred distinct damaged or
foreign files at once is already far more than an operator reads one by one."""

_REPORTED: OrderedDict[str, None] = OrderedDict()
"""The refusals :func:`report_once` logged at ERROR in this process, by message (one per
damaged or foreign file: the message names it and what was found), least recently said
first, at most ``REPORTED_LIMIT``."""


def report_once(logger: logging.Logger, error: Exception, what: str, *args: object) -> None:
    """Log ``what % args`` (which says ``error``) at ERROR the first time this process
    meets ``error`` (the same message: the same file, found the same way; a
    :class:`LedgerCorrupted`, or other stored data that does not read, such as a topic's
    record), at DEBUG after.

    Damaged or foreign data lasts until an operator acts, and what runs into it runs again
    (retention rounds, the retirement sweep, requests): one ERROR line says it; one each
    round would bury the other lines. Never with a traceback: the message says it all.

    Only the ``REPORTED_LIMIT`` most recently said messages are remembered, so a process
    meeting ever new ones keeps a bounded memory: a message forgotten (not said while that
    many others were) is said at ERROR once more when it comes again."""
    key = str(error)
    if key in _REPORTED:
        _REPORTED.move_to_end(key)
        logger.debug(what + " (said before)", *args)
        return
    _REPORTED[key] = None
    if len(_REPORTED) > REPORTED_LIMIT:
        _REPORTED.popitem(last=False)
    logger.error(what, *args)


class LedgerFenced(LedgerError):
    """Another writer changed this ledger's metadata: this one is no longer the owner."""


class CursorOverwritten(LedgerFenced):
    """A cursor's save found its record written by someone else since this process last
    saved it (an operator's repair from the store alone, a hand edit; or deleted), and it
    reads (one that does not is :class:`CursorDamaged`). The cursor in memory is stale and
    every later save of it would be refused: only an open of the ledger reads the record.
    So the ledger is told (:meth:`~segtxn.ledger.chain.LedgerChain.fenced`): it stops
    taking appends and its owner lets it go (a broker unloads the topic), and the next open
    reads the record as it is now.

    Retriable: the call made again reaches the cursor loaded again from that record. (Not
    told apart, it reached an acknowledging client as a bug, ``UnknownError``, every time.)
    """

    retriable = True


class EntryTooLarge(LedgerError):
    """An entry exceeds the ledger's maximum entry size."""


class LedgerUnwritable(LedgerError):
    """This log takes no more entries, and none of the batch that met this was
    acknowledged (too few of a replicated log's replicas answered). The managed ledger
    closes it at its count and writes the batch to its next ledger."""


class NotEnoughReplicas(LedgerError):
    """Fewer storage nodes answered than a replicated ledger needs (to create it, to
    acknowledge an entry, or to recover it). Retriable: nodes come back, or others join."""

    retriable = True


class StorageFull(LedgerError):
    """The data disk has no room (``ENOSPC``), or a quota is used up (``EDQUOT``), for a
    write or a new ledger file. Retriable: nothing the failed write held was acknowledged,
    and once there is room again the ledger reopens (recovery truncates what the write left
    behind) and takes appends. The message keeps the system's words ("No space left on
    device")."""

    retriable = True


class DeleteFailed(LedgerError):
    """A ledger's file (or its emptied directory) could not be removed: permission denied,
    an I/O error. The message names the path and keeps the system's words. Retriable: the
    deletion that met it stopped part-way, each of its steps is idempotent, and doing it
    again once the cause is gone (the volume's permissions fixed) goes on from there."""

    retriable = True


FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


@contextlib.contextmanager
def full_disk_is_retriable() -> Iterator[None]:
    """Raise :class:`StorageFull` (from it) for an ``OSError`` that says the disk or a quota
    is full; other errors pass unchanged."""
    try:
        yield
    except OSError as e:
        if e.errno not in FULL_DISK_ERRNOS:
            raise
        raise StorageFull(f"the data disk is full ({e})") from e


class WriteFailed(LedgerError):
    """An earlier write failed (``cause``), and the ledger takes no appends until it is
    reopened. ``retriable``: reopening may well work — too few replicas answered (they come
    back), or another broker recovered the ledger (then it is served there)."""

    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause
        self.retriable = isinstance(cause, LedgerFenced) or bool(getattr(cause, "retriable", False))


async def close_after_cut(close: Awaitable[object], what: str) -> None:
    """Await ``close``, the close of ``what`` (a ledger, a log: named with its ledger and
    file) that a step failed or cancelled part-way had opened (an open, a rollover), run
    in that step's ``except BaseException:`` handler before it raises on. The close's own
    failure is logged at WARNING, naming ``what`` (with the traceback when it is not an
    error a ledger, the store or the system gives: a bug), and not raised: the step's
    exception, or its cancel, is the one its caller must see.

    Why: raised, it replaced the step's. A cancelled open (a broker stopping, a take-over
    cut short) whose close then failed (its clean-close write refused by a store that was
    failing anyway, a log's file that would not close) raised a store, ledger or disk
    error instead of ``CancelledError``, and its caller took it for a failure of the
    ledger and went on as if it had not been stopped. A cancel of the close itself (past
    its grace) is raised: it is a cancel too."""
    try:
        await close
    except Exception as e:
        log.warning(
            "%s: closing it after the step that opened it was cut short failed: %s: %s "
            "(what cut that step is raised instead)", what, type(e).__name__, e,
            exc_info=not isinstance(e, (LedgerError, MetadataStoreError, OSError)),
        )  # fmt: skip
