"""OpenTelemetry tracing: the one place segtxn touches the tracing API (docs/tracing.md).

A transaction is followed across processes: the client's spans (the transaction, NEW_TXN,
each send, each ack, END_TXN), the coordinator's (NEW_TXN, END_TXN) and the brokers' (each
send, each ack, and the materialization of the outcome on each segment and subscription).
The context travels in the protocol: a W3C Trace Context ``traceparent`` header on REST
calls, an optional ``traceparent`` field in ``send`` and ``ack`` frames, and, from END_TXN
to the brokers, the header record's ``trace`` (participants learn outcomes from a watch,
never from a call, so materialization spans are roots of their own traces, linked to the
END_TXN that decided them).

Off by default, and then free: every entry point returns at its first test when no
provider is enabled (no span objects, no context look-ups, no frame field). A process turns
it on with :func:`configure` (the command line does, from the standard ``OTEL_*``
variables) or :func:`enable` (an application, or a test, with a provider of its own).
Servers make spans only for requests that carry a trace context (a client that traces):
a broker does not start a trace of its own per message of every untraced producer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
from collections.abc import Awaitable, Iterator, Mapping, MutableMapping
from typing import IO, Any, Protocol, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

CLIENT = "segtxn.client"
COORDINATOR = "segtxn.coordinator"
BROKER = "segtxn.broker"
"""Instrumentation scopes: which part of segtxn made a span (several share a process in
``segtxn standalone`` and in tests, under one ``service.name``)."""

TRACEPARENT = "traceparent"
MAX_CARRIER = 512
"""A ``traceparent`` longer than this is ignored, like a malformed one (version 00 has 55
characters; later versions may add fields)."""
EXPORTERS = ("otlp", "console", "none")

__all__ = [
    "BROKER",
    "CLIENT",
    "COORDINATOR",
    "TRACEPARENT",
    "AttributeValue",
    "Span",
    "SpanIds",
    "SpanKind",
    "TracingConfigError",
    "annotate",
    "configure",
    "current",
    "current_traceparent",
    "detached",
    "disable",
    "enable",
    "enabled",
    "end",
    "end_when_done",
    "flush",
    "inject",
    "linked",
    "remote",
    "server",
    "start",
    "traceparent",
]

_propagator = TraceContextTextMapPropagator()
_tracers: dict[str, Tracer] = {}
_provider: trace.TracerProvider | None = None
_owned: _Shutdown | None = None
"""The provider :func:`configure` made (shut down, flushing its spans, when replaced)."""


class _Shutdown(Protocol):
    def shutdown(self) -> None: ...


class TracingConfigError(ValueError):
    """An ``OTEL_*`` setting segtxn cannot honour (an unknown exporter, a protocol other
    than http/protobuf); the command line reports it as a usage error."""


_T = TypeVar("_T")


def enable(provider: trace.TracerProvider) -> None:
    """Trace into ``provider`` from now on (this process: clients and servers in it)."""
    global _provider, _drops_unsampled  # noqa: PLW0603 (one switch per process, at start-up)
    _provider = provider
    _drops_unsampled = _sampler_drops_unsampled(provider)
    _tracers.clear()


_drops_unsampled = False
"""The provider's sampler drops every span whose parent is not sampled (the parent-based
samplers, the default): such a span is not made at all, nor its context sent on. A root
span is still made, so that the sampler decides; only what follows a 'no' is skipped."""


def _sampler_drops_unsampled(provider: trace.TracerProvider) -> bool:
    """Ask the provider's sampler (an SDK provider has one) about a child of an unsampled
    parent, local and remote, with the trace id a ratio sampler keeps most surely."""
    sampler = getattr(provider, "sampler", None)
    should_sample = getattr(sampler, "should_sample", None)
    if should_sample is None:
        return False
    for remote_parent in (False, True):
        parent = trace.NonRecordingSpan(
            trace.SpanContext(1, 1, is_remote=remote_parent, trace_flags=trace.TraceFlags(0))
        )
        result = should_sample(trace.set_span_in_context(parent), 1, "probe")
        if result.decision.is_recording():
            return False
    return True


def _unsampled(context: trace.SpanContext) -> bool:
    return _drops_unsampled and context.is_valid and not context.trace_flags.sampled


def disable() -> None:
    """Stop tracing (the provider is not shut down: its owner does that)."""
    global _provider  # noqa: PLW0603
    _provider = None
    _tracers.clear()


def enabled() -> bool:
    return _provider is not None


def flush(timeout_s: float = 30.0) -> bool:
    """Export the spans ended so far now (blocking: not on an event loop that serves);
    False if the exporters did not finish within ``timeout_s``. Exit flushes by itself."""
    force_flush = getattr(_provider, "force_flush", None)
    return True if force_flush is None else bool(force_flush(int(timeout_s * 1000)))


def _tracer(scope: str) -> Tracer | None:
    if _provider is None:
        return None
    tracer = _tracers.get(scope)
    if tracer is None:
        tracer = _tracers[scope] = _provider.get_tracer(scope)
    return tracer


def configure(
    default_service: str, *, exporter: str | None = None, out: IO[str] | None = None
) -> bool:
    """Turn tracing on from the standard variables (this process's environment, which the
    SDK's parts read too), if they ask for it; returns whether they did.

    On when ``OTEL_TRACES_EXPORTER`` names exporters other than ``none`` (``otlp``: OTLP
    over HTTP/protobuf, ``console``: one JSON line per span on ``out``, stdout by
    default), or when it is unset and ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set; off with ``OTEL_SDK_DISABLED=true``.
    ``exporter`` (``--trace``: ``console``) stands for ``OTEL_TRACES_EXPORTER``. The
    exporter, sampler (``OTEL_TRACES_SAMPLER[_ARG]``), batching (``OTEL_BSP_*``) and
    resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``) read the rest of their
    settings themselves; ``default_service`` is the ``service.name`` when neither sets one.

    Raises:
        TracingConfigError: an exporter or OTLP protocol segtxn does not have.
    """
    environ = os.environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = _exporters(environ, exporter)
    if not names:
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_service}))
    provider = TracerProvider(resource=resource)  # its sampler: OTEL_TRACES_SAMPLER
    for name in names:
        if name == "console":
            console = ConsoleSpanExporter(
                out=out or sys.stdout, formatter=lambda span: span.to_json(indent=None) + "\n"
            )
            provider.add_span_processor(BatchSpanProcessor(console))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    global _owned  # noqa: PLW0603 (one switch per process, set at start-up)
    if _owned is not None:
        _owned.shutdown()
    _owned = provider
    enable(provider)
    return True


def _exporters(environ: Mapping[str, str], exporter: str | None) -> list[str]:
    """The exporters asked for (none: tracing stays off)."""
    spec = exporter or environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not spec:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        spec = "otlp" if endpoint else "none"
    names = [n.strip().lower() for n in spec.split(",") if n.strip()]
    for name in names:
        if name not in EXPORTERS:
            raise TracingConfigError(
                f"OTEL_TRACES_EXPORTER={spec}: segtxn has {', '.join(EXPORTERS)}"
            )
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if "otlp" in names and protocol != "http/protobuf":
        raise TracingConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: segtxn exports OTLP as http/protobuf"
        )
    return [n for n in names if n != "none"]


# ---------------------------------------------------------------------- spans


def start(
    scope: str,
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    parent: Span | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Span | None:
    """A started span (None when tracing is off, or under a parent the sampler said no
    to): a child of ``parent`` when given, else of the current span. The caller ends it
    with :func:`end`. ``attributes`` are set only on a span that records."""
    tracer = _tracer(scope)
    if tracer is None:
        return None
    above = trace.get_current_span() if parent is None else parent
    if _unsampled(above.get_span_context()):
        return None
    span = tracer.start_span(name, trace.set_span_in_context(above), kind)
    if attributes and span.is_recording():
        span.set_attributes(attributes)
    return span


def remote(
    scope: str,
    name: str,
    carrier: str | None,
    *,
    kind: SpanKind = SpanKind.SERVER,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Span | None:
    """A started span whose parent is the ``traceparent`` value ``carrier`` (a frame's
    field); None when tracing is off or there is no carrier. A malformed value is ignored
    (W3C Trace Context), as if there were none."""
    if carrier is None or len(carrier) > MAX_CARRIER:
        return None
    tracer = _tracer(scope)
    if tracer is None:
        return None
    if (  # version 00 with the sampled flag (the last hex digit's low bit) off
        _drops_unsampled
        and len(carrier) == 55
        and carrier.startswith("00-")
        and carrier[-1] in "02468ace"
    ):
        return None  # the sampler would drop it: skip the parsing too
    context = _propagator.extract({TRACEPARENT: carrier})
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    span = tracer.start_span(name, context, kind)
    if attributes and span.is_recording():
        span.set_attributes(attributes)
    return span


def server(
    scope: str,
    name: str,
    headers: Mapping[str, str],
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Span | None:
    """:func:`remote` for an HTTP request's ``traceparent`` header."""
    return remote(scope, name, headers.get(TRACEPARENT), attributes=attributes)


def end(span: Span | None, error: BaseException | None = None) -> None:
    """End ``span`` (nothing for None), marked failed with ``error`` when given."""
    if span is None:
        return
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    span.end()


async def call_in_span(
    scope: str,
    name: str,
    call: Awaitable[_T],
    *,
    parent: Span | None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> _T:
    """Await ``call`` under a CLIENT span ``name``, a child of ``parent``, ended with its
    outcome (an HTTP request made in it carries it to the server)."""
    span = start(scope, name, kind=SpanKind.CLIENT, parent=parent, attributes=attributes)
    try:
        with current(span):
            result = await call
    except BaseException as e:
        end(span, e)
        raise
    end(span)
    return result


def end_when_done(span: Span | None, future: asyncio.Future[Any]) -> None:
    """End ``span`` when ``future`` is done, failed with its error (or cancellation)."""
    if span is not None:
        future.add_done_callback(functools.partial(_ends, span))


def _ends(span: Span, future: asyncio.Future[Any]) -> None:
    end(span, asyncio.CancelledError() if future.cancelled() else future.exception())


def traceparent(span: Span | None) -> str | None:
    """The ``traceparent`` value naming ``span`` (to carry in a frame or a record)."""
    if span is None:
        return None
    context = span.get_span_context()  # formatted as the W3C propagator does, without it
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's ``traceparent`` to an HTTP request's headers (nothing when
    tracing is off or no span is current)."""
    if _provider is not None:
        _propagator.inject(headers)


def annotate(attributes: Mapping[str, AttributeValue]) -> None:
    """Set attributes on the current span (nothing when tracing is off)."""
    if _provider is not None:
        trace.get_current_span().set_attributes(attributes)


def current_traceparent() -> str | None:
    """The current span's ``traceparent`` value (None when tracing is off or no span is
    current)."""
    if _provider is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get(TRACEPARENT)


@contextlib.contextmanager
def current(span: Span | None) -> Iterator[None]:
    """Make ``span`` the current one inside the block (log lines then carry its ids; HTTP
    calls carry it); without ending it. Nothing for None."""
    if span is None:
        yield
        return
    with trace.use_span(span, end_on_exit=False, record_exception=False):
        yield


@contextlib.contextmanager
def detached() -> Iterator[None]:
    """No current span inside the block: a task created in it (a pre-started transaction's
    NEW_TXN) is not counted in the span that happens to be current."""
    if _provider is None:
        yield
        return
    token = otel_context.attach(otel_context.Context())
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def linked(
    scope: str,
    name: str,
    carrier: str | None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Iterator[Span | None]:
    """A current span for the block, the root of a trace of its own, linked to the span
    the ``traceparent`` value ``carrier`` names (materialization, linked to END_TXN). No
    span when tracing is off, or without a carrier (an END_TXN nobody traced)."""
    tracer = _tracer(scope)
    if tracer is None or carrier is None or len(carrier) > MAX_CARRIER:
        yield None
        return
    linked_to = trace.get_current_span(_propagator.extract({TRACEPARENT: carrier}))
    links = [Link(linked_to.get_span_context())] if linked_to.get_span_context().is_valid else []
    span = tracer.start_span(name, otel_context.Context(), SpanKind.INTERNAL, attributes, links)
    with trace.use_span(span, end_on_exit=True):
        yield span


# ---------------------------------------------------------------------- logs


class SpanIds(logging.Filter):
    """Gives each log record made under a span ``trace_id`` and ``span_id`` (hex, as
    exporters and trace UIs show them); records made outside one are left as they are.
    Installed on the log handlers when tracing is on (segtxn/cli/logs.py formats them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        return True
