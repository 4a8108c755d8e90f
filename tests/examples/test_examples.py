"""Every program in examples/ runs, as a user runs it (``python examples/NN_....py URL``, a
real process), against a real broker and coordinator (tests/cluster.py), and prints what its
docstring promises; the ScalableTopic manifest fits its CRD and the operator makes the topic
it describes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from segtxn import tracing
from segtxn.client import Client
from segtxn.operator import topicplan
from tests.cluster import Cluster
from tests.manifests.support import validate
from tests.operator.emulator import emulator, operator
from tests.operator.support import WAIT_S, Local, status
from tests.operator.support import cluster as create_cluster
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RUN_S = 120
MEMORY = pytest.mark.parametrize("cluster", ["memory"], indirect=True)
"""The programs run on the embedded store (the client sees no difference)."""


async def run(name: str, url: str) -> list[str]:
    """Run ``examples/<name>`` to its end; its stdout lines."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / name),
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    out, err = await asyncio.wait_for(process.communicate(), RUN_S)
    assert process.returncode == 0, err.decode()
    return out.decode().splitlines()


def test_every_example_is_tested() -> None:
    tested = {
        "01_produce_consume.py",
        "02_transaction.py",
        "03_consume_transform_produce.py",
        "04_split_during_transaction.py",
        "05_scalable_topic.yaml",
        "06_tracing.py",
    }
    assert {p.name for p in EXAMPLES.iterdir() if p.is_file()} == tested


@MEMORY
async def test_01_produce_consume(cluster: Cluster) -> None:
    lines = await run("01_produce_consume.py", cluster.url)
    received = [line.split(maxsplit=1)[1] for line in lines if line.startswith("received")]
    assert sorted(received) == sorted(f"customer-{i % 2} hello {i}" for i in range(6))
    for key in ("customer-0", "customer-1"):  # each key's in the order sent
        mine = [r for r in received if r.startswith(key)]
        assert mine == sorted(mine, key=lambda r: int(r.split()[-1]))
    again = await run("01_produce_consume.py", cluster.url)  # a second run reuses the topic
    assert len([line for line in again if line.startswith("received")]) == 6


@MEMORY
async def test_02_transaction(cluster: Cluster) -> None:
    lines = await run("02_transaction.py", cluster.url)
    assert lines[0].startswith("committed ") and lines[0].endswith(": COMMITTED")
    assert lines[1].startswith("aborted ") and lines[1].endswith(": ABORTED")
    assert lines[2] == "payments delivered: order-1, order-2"


@MEMORY
async def test_03_consume_transform_produce(cluster: Cluster) -> None:
    lines = await run("03_consume_transform_produce.py", cluster.url)
    assert "processed 10 words" in lines
    assert lines[-1] == "10 outputs: THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG AGAIN"
    async with Client(cluster.url) as client:  # every input acknowledged, once
        stats = await client.admin.stats("topic://examples/pipeline/words")
    backlog = [
        sub["backlog"]
        for segment in stats["segments"]
        for sub in segment["stats"]["subscriptions"].values()
    ]
    assert backlog == [0]
    again = await run("03_consume_transform_produce.py", cluster.url)  # the topics exist
    assert again[-1] == lines[-1]  # its own 10 outputs, not the last run's too


@MEMORY
async def test_04_split_during_transaction(cluster: Cluster) -> None:
    lines = await run("04_split_during_transaction.py", cluster.url)
    assert lines[0].startswith("split segment 0 during ")
    assert lines[0].endswith("active segments now [1, 2]")
    assert lines[1].startswith("committed ")
    assert lines[2:] == [f"user-{k}: clicks [0, 1, 2, 3, 4, 5]" for k in range(4)]


@MEMORY
async def test_06_tracing(cluster: Cluster) -> None:
    """The example's spans (its stdout) and the servers' (in this process: tracing on here
    too) are one trace, the one it names; the materialization spans link to it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        lines = await run("06_tracing.py", cluster.url)

        def linked() -> list[ReadableSpan]:
            return [s for s in exporter.get_finished_spans() if s.name.startswith("materialize")]

        await wait_until(lambda: len(linked()) == 3, what="writes on 2 segments, acks on 1")
    finally:
        tracing.disable()
        provider.shutdown()
    (named,) = [line.split()[1] for line in lines if line.startswith("trace ")]
    assert next(line for line in lines if line.startswith("committed ")).endswith(": COMMITTED")
    client_spans = [json.loads(line) for line in lines if line.startswith("{")]
    in_trace = {s["name"] for s in client_spans if s["context"]["trace_id"] == f"0x{named}"}
    assert {"transaction", "new-txn", "end-txn"} <= in_trace
    assert len([n for n in in_trace if n.startswith("send segment://examples/traced/in")]) == 2
    assert any(n.startswith("ack segment://examples/traced/orders/") for n in in_trace)
    # the order sent before the transaction is a trace of its own
    assert [s for s in client_spans if s["name"].startswith("send segment://examples/traced/o")]
    served = {
        s.name for s in exporter.get_finished_spans() if f"{s.context.trace_id:032x}" == named
    }
    assert {"new-txn", "end-txn"} <= served
    assert any(n.startswith("send segment://examples/traced/invoices/") for n in served)
    assert any(n.startswith("ack segment://examples/traced/orders/") for n in served)
    for span in linked():
        assert [f"{link.context.trace_id:032x}" for link in span.links] == [named]


@pytest.mark.timeout(180)
async def test_05_scalable_topic(local: Local) -> None:
    manifest: dict[str, Any] = yaml.safe_load((EXAMPLES / "05_scalable_topic.yaml").read_text())
    validate(manifest)  # against crds/scalabletopic.yaml's schema
    spec = manifest["spec"]
    async with emulator() as emu, operator(emu, local.memo()):
        await create_cluster(emu, local)  # the SegtxnCluster its clusterRef names
        name = manifest["metadata"]["name"]
        await emu.create("ScalableTopic", name, spec)
        await wait_until(
            lambda: (
                status(emu, "ScalableTopic", name).get("activeSegments") == spec["targetSegments"]
            ),
            timeout=WAIT_S,
            what="the example's topic split to its target",
        )
    async with Client(local.broker.url) as client:
        stats = await client.admin.stats(topicplan.topic_of(spec))
    assert stats["activeSegments"] == spec["targetSegments"] == 4


@MEMORY
async def test_the_readme_transaction_runs(cluster: Cluster, tmp_path: Path) -> None:
    """The README's Python program, after its shell steps (the topic, a message in it, the
    shell's consume reading it all on its own subscription)."""
    readme = (ROOT / "README.md").read_text()
    consume = re.search(r"segtxn consume topic://acme/orders/events (\S+)", readme)
    assert consume is not None
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    program = next(b for b in blocks if "client.transaction(" in b)
    assert "http://127.0.0.1:8080" in program
    (tmp_path / "readme.py").write_text(program.replace("http://127.0.0.1:8080", cluster.url))
    async with Client(cluster.url) as client:
        await client.admin.create_topic("topic://acme/orders/events", segments=4)
        await client.admin.create_topic("topic://acme/orders/invoices")  # an earlier run's
        producer = await client.create_producer("topic://acme/orders/events")
        await producer.send(b"order 1", key="customer-42")
        shell = await client.subscribe(
            "topic://acme/orders/events", consume.group(1), initial_position="earliest"
        )
        await shell.acknowledge(await shell.receive(timeout_s=10))
        await shell.close()
    lines = await run(str(tmp_path / "readme.py"), cluster.url)
    assert len(lines) == 1 and lines[0].endswith(": COMMITTED"), lines
    async with Client(cluster.url) as client:
        reader = await client.subscribe(
            "topic://acme/orders/invoices", "check", initial_position="earliest"
        )
        invoice = await reader.receive(timeout_s=10)
    assert (invoice.key, invoice.value) == ("customer-42", b"invoice for order 1")
