"""Tracing configured as OpenTelemetry's SDKs are, by the standard ``OTEL_*`` variables:
off unless they ask, the console exporter, an OTLP/HTTP exporter sending to a real HTTP
endpoint, the sampler and the service name, and clear errors for what segtxn lacks."""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections.abc import Iterator

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from segtxn import tracing
from segtxn.web import Listener


@pytest.fixture(autouse=True)
def tracing_off_after() -> Iterator[None]:
    yield
    tracing.disable()


def setenv(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]) -> None:
    """Exactly ``environ`` of the ``OTEL_*`` variables (the SDK reads the environment)."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)


def one_span(name: str) -> None:
    span = tracing.start(tracing.CLIENT, name)
    assert span is not None
    tracing.end(span)


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_SERVICE_NAME": "named", "OTEL_TRACES_SAMPLER": "always_on"},
        {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"},
        {"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
    ],
)
def test_off_unless_the_variables_ask(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, environ)
    assert tracing.configure("segtxn-test") is False
    assert not tracing.enabled()
    assert tracing.start(tracing.CLIENT, "nothing") is None


def test_console_writes_one_json_line_per_span_with_the_service_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    setenv(monkeypatch, {"OTEL_TRACES_EXPORTER": "console"})
    assert tracing.configure("segtxn-test", out=out)
    one_span("first")
    one_span("second")
    assert tracing.flush(10)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["name"] for line in lines] == ["first", "second"]
    assert {line["resource"]["attributes"]["service.name"] for line in lines} == {"segtxn-test"}


def test_otel_service_name_and_sampler_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    setenv(monkeypatch, {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "billing"})
    assert tracing.configure("segtxn-test", out=out)
    one_span("kept")
    assert tracing.flush(10)
    assert json.loads(out.getvalue())["resource"]["attributes"]["service.name"] == "billing"

    dropped = io.StringIO()
    setenv(monkeypatch, {"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "always_off"})
    assert tracing.configure("segtxn-test", out=dropped)
    one_span("sampled out")
    assert tracing.flush(10)
    assert dropped.getvalue() == ""


def test_the_exporter_flag_stands_for_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    setenv(monkeypatch, {"OTEL_TRACES_EXPORTER": "none"})
    assert tracing.configure("segtxn-test", exporter="console", out=out)
    one_span("asked for")
    assert tracing.flush(10)
    assert json.loads(out.getvalue())["name"] == "asked for"


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "zipkin"),
        ({"OTEL_TRACES_EXPORTER": "console,jaeger"}, "jaeger"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            },
            "http/protobuf",
        ),
    ],
)
def test_what_segtxn_lacks_is_a_clear_error(
    environ: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, environ)
    with pytest.raises(tracing.TracingConfigError, match=named):
        tracing.configure("segtxn-test")
    assert not tracing.enabled()


async def test_otlp_sends_the_spans_to_the_endpoint_over_http(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` alone turns OTLP on; a real HTTP server receives
    ``/v1/traces`` as protobuf."""
    received: list[ExportTraceServiceRequest] = []
    arrived = asyncio.Event()

    async def traces(request: web.Request) -> web.Response:
        assert request.headers["Content-Type"] == "application/x-protobuf"
        parsed = ExportTraceServiceRequest()
        parsed.ParseFromString(await request.read())
        received.append(parsed)
        arrived.set()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    listener = Listener("127.0.0.1")  # its port, held from the pick on
    port = listener.port
    await web.SockSite(runner, listener.socket).start()
    try:
        setenv(monkeypatch, {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"})
        assert tracing.configure("segtxn-otlp")
        one_span("exported")
        assert await asyncio.to_thread(tracing.flush, 10)  # the exporter blocks: a thread
        async with asyncio.timeout(10):
            await arrived.wait()
    finally:
        tracing.disable()
        await runner.cleanup()
    (resource_spans,) = received[0].resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "segtxn-otlp"
    names = [s.name for scope in resource_spans.scope_spans for s in scope.spans]
    assert names == ["exported"]
