"""Tracing of the command line: a real ``segtxn standalone --trace`` process prints the spans
of a traced client's transaction (its own client in this process) as JSON lines on stdout,
in the client's trace; its log lines under a span carry the trace id, in text and JSON; and
an exporter segtxn lacks is a usage error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from segtxn import tracing
from segtxn.cli.commands import main
from segtxn.cli.traces import DEMO_SAMPLER, child_env
from segtxn.client import Client
from tests.processes import SEGTXN, wait_ready
from tests.serving import serving_url

TOPIC = "topic://acme/cli/traced"
STOP_S = 20.0


@pytest.fixture
def traced_client() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


def start(out: Path, err: Path, *flags: str) -> subprocess.Popen[bytes]:
    """``segtxn -vv standalone --trace`` without any ``OTEL_*`` variable, on ports it picks
    (its URL: :func:`~tests.serving.serving_url` of ``err``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        return subprocess.Popen(
            [SEGTXN, "-vv", "standalone", "--trace", *flags, "--host", "127.0.0.1",
             "--port", "0", "--coordinator-port", "0"],
            stdout=stdout,
            stderr=stderr,
            env=env,
        )  # fmt: skip


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_standalone_trace_prints_the_servers_spans_of_a_clients_trace(
    tmp_path: Path, log_format: str, traced_client: InMemorySpanExporter
) -> None:
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    proc = start(out, err, "--log-format", log_format)
    try:
        url = await serving_url(err, proc, "standalone")
        await wait_ready(url, "standalone")
        async with Client(url) as client:
            await client.admin.create_topic(TOPIC, segments=2)
            producer = await client.create_producer(TOPIC)
            async with client.transaction() as txn:
                await producer.send(b"a", key="a", txn=txn)
                await producer.send(b"b", key="b", txn=txn)
                assert txn.span is not None
                trace_id = f"{txn.span.get_span_context().trace_id:032x}"
        proc.send_signal(signal.SIGTERM)  # spans still queued are exported at exit
        assert proc.wait(timeout=STOP_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    spans = [json.loads(line) for line in out.read_text().splitlines()]  # nothing else there
    mine = [s for s in spans if s["context"]["trace_id"] == f"0x{trace_id}"]
    names = sorted(s["name"] for s in mine)
    assert names[:2] == ["end-txn", "new-txn"] and len(names) == 4, names  # + 2 sends
    assert all(n.startswith(f"send segment://{TOPIC[len('topic://') :]}/") for n in names[2:])
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"segtxn-standalone"}
    linked = [s for s in spans if any(link["context"]["trace_id"] == f"0x{trace_id}"
                                      for link in s["links"])]  # fmt: skip
    assert linked and all(s["name"].startswith("materialize writes ") for s in linked)
    # the DEBUG line of the commit, logged under its END_TXN span: the broker's, as every
    # operation went to it (the one-step commit)
    committed = [line for line in err.read_text().splitlines() if ": COMMITTED here" in line]
    assert committed, err.read_text()[-2000:]
    line = committed[0]
    if log_format == "json":
        entry = json.loads(line)
        assert entry["logger"] == "segtxn.broker.txncommit"
        assert entry["trace_id"] == trace_id and len(entry["span_id"]) == 16
    else:
        assert " DEBUG segtxn.broker.txncommit: " in line
        assert f" trace_id={trace_id} span_id=" in line


def test_an_exporter_segtxn_lacks_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["standalone"], env={"OTEL_TRACES_EXPORTER": "zipkin"})
    assert result.exit_code == 2
    assert "OTEL_TRACES_EXPORTER=zipkin: segtxn has otlp, console, none" in result.output
    assert not tracing.enabled()


def test_the_demo_gives_its_processes_the_console_exporter_and_a_sampler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    assert child_env(False) == {}
    assert child_env(True) == {
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_TRACES_SAMPLER": DEMO_SAMPLER[0],
        "OTEL_TRACES_SAMPLER_ARG": DEMO_SAMPLER[1],
    }
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")  # the user's sampler stands
    assert child_env(True) == {"OTEL_TRACES_EXPORTER": "console"}
