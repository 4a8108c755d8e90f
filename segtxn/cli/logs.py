"""``--log-format`` and ``--access-log`` of the server commands (``broker``, ``coordinator``,
``standalone``, ``operator``): how their log lines look, and whether each HTTP request gets
one.

``--log-format json`` writes one JSON object per line on stderr, for a log pipeline (Loki,
Elasticsearch, ``kubectl logs | jq``): ``ts`` (UTC, ISO 8601 with milliseconds), ``level``,
``logger``, ``msg``, ``error`` (``Type: message``) when a line carries an exception, and
``object`` (kind, namespace, name) on the operator's lines about a resource. It is
trace-free: a traceback would spread one event over many lines, or bury it in one huge
field; ``-vv`` with the default text format shows tracebacks when they are wanted.

With tracing on (docs/tracing.md), a line logged under a span carries its ids: text lines
end with `` trace_id=<32 hex> span_id=<16 hex>``, JSON objects have ``trace_id`` and
``span_id``, the ids trace back-ends show, so a line leads to its trace and back.

Access lines (logger ``aiohttp.access``, :class:`segtxn.web.AccessLogger`) are off by
default, whatever the verbosity: a transaction's calls (NEW_TXN, ADD_*, END_TXN) and every
admin and health poll would bury the domain events an operator reads. ``--access-log``
(broker, coordinator, standalone; defined with them in :mod:`segtxn.cli.servers`, so that
this module, which every command imports, does not import the web servers) logs them at
INFO.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from segtxn.cli import verbosity
from segtxn.tracing import SpanIds

F = TypeVar("F", bound=Callable[..., None])

TEXT = "text"
JSON = "json"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line, without a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ref = getattr(record, "k8s_ref", None)  # what a Kopf handler's line is about
        if isinstance(ref, dict):
            line["object"] = {k: ref.get(k) for k in ("kind", "namespace", "name")}
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            line["error"] = f"{type(error).__name__}: {error}"
        trace_id = getattr(record, "trace_id", None)  # logged under a span (tracing on)
        if trace_id is not None:
            line["trace_id"] = trace_id
            line["span_id"] = getattr(record, "span_id", None)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``segtxn -v``'s text lines, ending with `` trace_id=... span_id=...`` when logged
    under a span (the ids :class:`segtxn.tracing.SpanIds` puts on the record)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        trace_id = getattr(record, "trace_id", None)
        if trace_id is None:
            return line
        return f"{line} trace_id={trace_id} span_id={getattr(record, 'span_id', '')}"


def show_span_ids() -> None:
    """Tracing is on: the log handlers ``segtxn -v`` set up (the root logger's) give each
    line logged under a span its ids, in text (:class:`TextFormatter`) or JSON."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, SpanIds) for f in handler.filters):
            handler.addFilter(SpanIds())
        if not isinstance(handler.formatter, JsonFormatter | TextFormatter):
            handler.setFormatter(TextFormatter(verbosity.FORMAT))


_format = TEXT


def configure(log_format: str) -> None:
    """Apply ``--log-format`` to the handlers ``segtxn -v`` set up (the root logger's) and
    to :func:`say`."""
    global _format  # noqa: PLW0603 (parsed once at start-up, read by say())
    _format = log_format
    if log_format == JSON:
        formatter = JsonFormatter()
        for handler in logging.getLogger().handlers:
            handler.setFormatter(formatter)


def say(line: str) -> None:
    """A server command's own line on stderr (serving, stopping, closed), shown whatever the
    verbosity; with ``--log-format json``, as a JSON object (logger ``segtxn.cli``) so that
    stderr stays one object per line."""
    if _format == JSON:
        record = logging.LogRecord("segtxn.cli", logging.INFO, __file__, 0, line, None, None)
        line = JsonFormatter().format(record)
    click.echo(line, err=True)


def log_format_option(command: F) -> F:
    """Add ``--log-format`` to a server command and apply it before the command runs."""

    @click.option(
        "--log-format",
        type=click.Choice([TEXT, JSON]),
        default=TEXT,
        show_default=True,
        help="Log lines as text, or as one JSON object per line (ts, level, logger, msg, "
        "error; no tracebacks).",
    )
    @functools.wraps(command)
    def wrapped(*args: Any, log_format: str, **kwargs: Any) -> None:
        configure(log_format)
        command(*args, **kwargs)

    return wrapped  # type: ignore[return-value]
