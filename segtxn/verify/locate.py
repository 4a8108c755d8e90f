"""Where an anomaly's entries appear in a run's files: the clients' histories and the logs.

A count says *that* something went wrong; to find out *why*, an operator follows the entries
involved (message ids, transaction ids) through the run directory: the history lines that
sent, received or committed them (``history/<client>.jsonl``) and the process logs that
mention them (``logs/<process>.log``). :func:`locate` does that search for the checker's
samples, in one bounded pass over the files.

It searches text, not formats (other processes add log lines all the time): each line is cut
into tokens (runs of characters other than spaces, quotes, brackets, ``,;=``; trailing
``:.,`` dropped) and a token equal to a wanted id is a mention. A message id
``segment://t/ns/name/3@12:40`` is also mentioned by a line that names its segment
(``segment://t/ns/name/3``) and its position (``12:40``) separately, as broker logs do.

Histories kept in a topic rather than in files come as lines (the checker finds the events
that contain a wanted id with Spark, :func:`segtxn.verify.checker.history_lines`): their
places are ``history/<client>:N``, the client's N-th event, as ``history/<client>.jsonl:N``
is its N-th line.

Bounds: at most :data:`PLACES` places kept per entry and per kind of file (histories, logs),
at most :data:`MAX_LINES` lines read per file; the number of mentions is counted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PLACES = 3
"""Places kept per entry, in histories and again in logs."""
MAX_LINES = 1_000_000
"""Lines read per file; the rest of a longer file is not searched (the report says so)."""
SNIPPET = 160
"""Characters of a matching line kept for the HTML report."""

_TOKEN = re.compile(r"[^\s\"'(),;\[\]{}<>=]+")
_POSITION = re.compile(r"(?<![\w:.])\d+:\d+(?![\w:])")


@dataclass(frozen=True)
class Place:
    """One line of a run's file: ``path`` relative to the run directory, ``line`` from 1."""

    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class Mentions:
    """Where one entry appears: the first few places in histories and in logs, and how many
    lines mention it in all (within the files' bounds)."""

    entry: str
    history: list[Place] = field(default_factory=list)
    logs: list[Place] = field(default_factory=list)
    total: int = 0

    @property
    def places(self) -> list[Place]:
        return self.history + self.logs


@dataclass
class Located:
    """The mentions of every entry asked for, and the files that were cut short."""

    mentions: dict[str, Mentions]
    truncated: list[str] = field(default_factory=list)


def run_files(run_dir: Path) -> list[tuple[str, Path]]:
    """The files searched, histories first, each as (``"history"`` | ``"logs"``, path)."""
    return [("history", p) for p in sorted((run_dir / "history").glob("*.jsonl"))] + [
        ("logs", p) for p in sorted((run_dir / "logs").glob("*.log"))
    ]


def locate(
    run_dir: Path | None,
    entries: Iterable[str],
    history: Sequence[tuple[str, int, str]] = (),
) -> Located:
    """Find where each of ``entries`` (message or transaction ids, as the clients print
    them) is mentioned: in ``history`` (lines of histories kept in a topic: ``(name, line
    number, text)``), then in ``run_dir``'s history files and logs (None: no files)."""
    found = {entry: Mentions(entry) for entry in entries}
    by_segment: dict[str, set[str]] = {}
    for entry in found:
        segment, at, position = entry.rpartition("@")
        if at and segment.startswith("segment://"):
            by_segment.setdefault(segment, set()).add(position)
    located = Located(found)
    if not found:
        return located
    for name, number, line in history:
        _take(found, by_segment, "history", Place(name, number, line))
    if run_dir is None:
        return located
    for kind, path in run_files(run_dir):
        name = str(path.relative_to(run_dir))
        with path.open("rb") as lines:
            for number, raw in enumerate(lines, start=1):
                if number > MAX_LINES:
                    located.truncated.append(name)
                    break
                line = raw.decode(errors="replace").rstrip("\n")
                _take(found, by_segment, kind, Place(name, number, line))
    return located


def _take(
    found: dict[str, Mentions], by_segment: dict[str, set[str]], kind: str, place: Place
) -> None:
    """Count ``place``'s line for every entry it mentions (keeping the first few places)."""
    for entry in _mentioned(place.text, found, by_segment):
        mentions = found[entry]
        mentions.total += 1
        kept = mentions.history if kind == "history" else mentions.logs
        if len(kept) < PLACES:
            kept.append(Place(place.path, place.line, place.text[:SNIPPET]))


def _mentioned(line: str, wanted: dict[str, Mentions], by_segment: dict[str, set[str]]) -> set[str]:
    hits = {t for t in (token.rstrip(":.,") for token in _TOKEN.findall(line)) if t in wanted}
    if by_segment and "segment://" in line:
        segments = [s for s in by_segment if _names(line, s)]
        if segments:
            positions = set(_POSITION.findall(line))
            hits.update(f"{s}@{p}" for s in segments for p in positions & by_segment[s])
    return hits


def _names(line: str, segment: str) -> bool:
    """Whether ``line`` names ``segment`` (not merely a longer id that starts the same)."""
    at = line.find(segment)
    while at >= 0:
        end = at + len(segment)
        if end == len(line) or not line[end].isdigit():
            return True
        at = line.find(segment, end)
    return False
