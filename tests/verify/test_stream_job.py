"""``segtxn verify stream`` refuses, in one line, a run whose topics are not on the cluster
(before it starts Spark)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from segtxn.cli import main
from tests.cluster import Cluster


async def test_stream_names_the_topics_it_waited_for(cluster: Cluster, tmp_path: Path) -> None:
    args = ["verify", "stream", "--url", cluster.url, "--run", "absent"]
    args += ["--run-dir", str(tmp_path), "--wait", "0.5"]
    result = await asyncio.to_thread(CliRunner().invoke, main, args)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "topic://verify/absent/input, topic://verify/absent/out-a" in lines[0]
    assert "after 0.5 s (is run 'absent' started, on this cluster?)" in lines[0]
