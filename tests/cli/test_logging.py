"""A real ``segtxn standalone`` process's log: ``--log-format json`` gives one JSON object per
line on stderr (its own lines too), without tracebacks; the domain events an operator reads
are there at INFO (topic created, loaded, a producer and a consumer coming and going, the
shutdown); access lines only with ``--access-log``."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from segtxn.cli.commands import main
from segtxn.cli.logs import JsonFormatter
from segtxn.client import Client
from tests.processes import SEGTXN, wait_ready
from tests.serving import serving_url

TOPIC = "persistent://acme/logs/events"
STOP_S = 20.0


def start(stderr_path: Path, *flags: str) -> subprocess.Popen[bytes]:
    """On ports it picks (its URL: :func:`~tests.serving.serving_url` of ``stderr_path``)."""
    with stderr_path.open("wb") as stderr:
        return subprocess.Popen(
            [SEGTXN, "-v", "standalone", "--host", "127.0.0.1", "--port", "0",
             "--coordinator-port", "0", *flags],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )  # fmt: skip


async def run_standalone(tmp_path: Path, *flags: str) -> list[str]:
    """Start it with ``flags``, produce and consume one message, stop it; its stderr lines."""
    stderr_path = tmp_path / "stderr.txt"
    proc = start(stderr_path, *flags)
    try:
        url = await serving_url(stderr_path, proc, "standalone")
        await wait_ready(url, "standalone")
        async with Client(url) as client:
            await client.admin.create_topic(TOPIC)
            consumer = await client.subscribe(TOPIC, "sub")
            producer = await client.create_producer(TOPIC)
            await producer.send(b"m")
            await consumer.acknowledge(await consumer.receive(timeout_s=10))
            await producer.close()
            await consumer.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return stderr_path.read_text().splitlines()


def objects(lines: list[str]) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in lines]
    for entry in parsed:
        assert isinstance(entry, dict) and set(entry) >= {"ts", "level", "logger", "msg"}, entry
    return parsed


async def test_json_lines_tell_the_domain_events_and_no_requests(tmp_path: Path) -> None:
    lines = await run_standalone(tmp_path, "--log-format", "json")
    logged = objects(lines)  # every line: json.loads fails on anything else
    messages = "\n".join(f"{e['level']} {e['logger']}: {e['msg']}" for e in logged)
    assert f"INFO segtxn.topics.catalog: topic created: {TOPIC}" in messages
    assert f"INFO segtxn.broker.service: loaded {TOPIC} on broker standalone" in messages
    assert f"{TOPIC}: producer " in messages and " connected (from " in messages
    assert " disconnected (closed)" in messages
    assert f"{TOPIC}/sub: consumer " in messages and " detached (closed)" in messages
    assert "INFO segtxn.cli: serving: broker standalone" in messages
    assert "INFO segtxn.broker.service: broker standalone: stopped" in messages
    assert not [e for e in logged if e["logger"] == "aiohttp.access"], messages
    assert "Traceback" not in messages
    assert all(e["ts"].endswith("Z") for e in logged)


async def test_access_lines_only_when_asked(tmp_path: Path) -> None:
    lines = await run_standalone(tmp_path, "--access-log")
    access = [line for line in lines if " aiohttp.access: " in line]
    assert any("GET /readyz -> 200" in line for line in access), lines
    assert all(" INFO " in line for line in access)


def test_an_exception_is_one_field_not_a_traceback() -> None:
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed: %s", ("it",), None)
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line
    assert json.loads(line)["error"] == "ValueError: bad\nvalue"
    assert json.loads(line)["msg"] == "failed: it"


def test_an_operator_line_about_a_resource_names_it() -> None:
    record = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "reconciled", (), None)
    record.k8s_ref = {"kind": "SegtxnCluster", "namespace": "team-a", "name": "orders", "uid": "u"}
    entry = json.loads(JsonFormatter().format(record))
    assert entry["object"] == {"kind": "SegtxnCluster", "namespace": "team-a", "name": "orders"}


@pytest.mark.parametrize(
    ("command", "access_log"),
    [("broker", True), ("coordinator", True), ("standalone", True), ("operator", False)],
)
def test_every_server_command_takes_the_flags(command: str, access_log: bool) -> None:
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "--log-format [text|json]" in result.output
    assert ("--access-log" in result.output) is access_log


def test_a_log_format_other_than_text_or_json_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["standalone", "--log-format", "xml"])
    assert result.exit_code == 2
    assert "'xml' is not one of 'text', 'json'" in result.output
