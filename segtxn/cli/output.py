"""How the commands print what they found: ``-o table`` for people, ``-o json`` for scripts.

Every command that prints data takes the same :data:`OUTPUT` option and prints through
:func:`show`, so the choice means the same everywhere:

- ``table`` (the default): aligned columns under upper-case headers, or ``KEY VALUE`` rows
  for a record; times in words ("expires in 115 s", "2 min ago"), hashes in hex. Meant to be
  read, and free to change.
- ``json``: one JSON document on stdout, keys sorted, the server's own field names and units
  (epoch milliseconds, hashes as numbers). Meant to be parsed, and kept stable.

Progress and notes go to stderr in both, so stdout holds only the data.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


class Format(enum.StrEnum):
    TABLE = "table"
    JSON = "json"


OUTPUT: Callable[[F], F] = click.option(
    "-o",
    "--output",
    type=click.Choice([f.value for f in Format]),
    default=Format.TABLE.value,
    show_default=True,
    help="table: for people; json: one document with stable keys, for scripts.",
)
"""``-o/--output table|json``: every command that prints data takes it."""


@dataclass(frozen=True)
class Table:
    """Rows under named columns, printed aligned (the last column is not padded). With no
    rows, :func:`show` prints nothing on stdout and says ``empty`` on stderr."""

    columns: Sequence[str]
    rows: Sequence[Sequence[object]]
    empty: str = "none"

    def render(self) -> str:
        cells = [[c.upper() for c in self.columns]]
        cells += [[_cell(v) for v in row] for row in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
        return "\n".join(line.rstrip() for line in lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(_cell(v) for v in value) if value else "-"
    return str(value)


def record(
    data: Mapping[str, Any], *, times: Mapping[str, Callable[[int], str]] | None = None
) -> Table:
    """A nested record as ``KEY VALUE`` rows, nested keys joined with dots
    (``storage.entriesWritten``); ``times`` turns the named fields' epoch milliseconds into
    words (see :func:`until` and :func:`since`), under the name without its ``Ms``."""
    rows: list[tuple[str, object]] = []
    times = times or {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key in sorted(value):
                walk(f"{prefix}.{key}" if prefix else str(key), value[key])
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            for i, item in enumerate(value):
                walk(f"{prefix}[{i}]", item)
        elif isinstance(value, Mapping):
            rows.append((prefix, "-"))
        elif prefix in times:
            when = times[prefix](int(value)) if isinstance(value, int | float) else value
            rows.append((prefix.removesuffix("Ms"), when))
        else:
            rows.append((prefix, value))

    walk("", data)
    return Table(("key", "value"), rows)


def show(output: str, data: Any, human: Table | str | None = None) -> None:
    """Print ``data``: as JSON with ``-o json``; else ``human`` (a table or a line), or, by
    default, ``data`` as a record (:func:`record`) or a one-column list."""
    if output == Format.JSON:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    if human is None:
        human = record(data) if isinstance(data, Mapping) else Table(("name",), [[d] for d in data])
    if isinstance(human, Table) and not human.rows:
        click.echo(human.empty, err=True)
        return
    click.echo(human.render() if isinstance(human, Table) else human)


def span(seconds: float) -> str:
    """A duration in words, to the precision a person wants: ``115 s``, ``17 min``,
    ``5 h 3 min``, ``3 d 4 h``."""
    s = round(abs(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 2 * 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _now_ms() -> int:
    return int(time.time() * 1000)


def until(deadline_ms: int, now_ms: int | None = None) -> str:
    """A deadline in words: ``expires in 115 s``, or ``expired 3 s ago``."""
    left = (deadline_ms - (_now_ms() if now_ms is None else now_ms)) / 1000
    return f"expires in {span(left)}" if left >= 0 else f"expired {span(left)} ago"


def since(moment_ms: int, now_ms: int | None = None) -> str:
    """A past moment in words: ``2 min ago`` (``in 1 s`` for a clock a little ahead)."""
    age = ((_now_ms() if now_ms is None else now_ms) - moment_ms) / 1000
    return f"{span(age)} ago" if age >= 0 else f"in {span(age)}"


def hash_range(bounds: Sequence[int]) -> str:
    """A segment's inclusive key-hash range, ``0x0000-0x7fff``."""
    lo, hi = bounds
    return f"{lo:#06x}-{hi:#06x}"
