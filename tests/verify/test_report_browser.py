"""The report as a reader sees it: runs checked by the real checker (Spark), their report
written as a run writes it, opened in a real headless Chromium (Debian's ``chromium`` driven
by playwright; ``make test`` installs both). The page renders, the verdict is visible, each
plot has data, labels do not overlap, a failing run's anomalies sit on the timeline at
their time, and the screenshot is kept next to ``report.html``."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from playwright.async_api import Locator, Page, async_playwright
from pyspark.sql import SparkSession

from segtxn.verify.checker import check
from segtxn.verify.report import write_report
from segtxn.verify.report.screenshot import WIDTH_PX, chromium
from segtxn.verify.workload import RunInfo
from tests.verify.runs import Run, event

PLOTS = ("throughput", "backlog", "active", "outcomes", "latency")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@asynccontextmanager
async def opened(page_path: Path) -> AsyncIterator[Page]:
    """``page_path`` in a new headless Chromium."""
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            tab = await browser.new_page(viewport={"width": WIDTH_PX, "height": 900})
            await tab.goto(page_path.as_uri())
            yield tab
        finally:
            await browser.close()


def recorded_run() -> Run:
    """The clean run, over 10 s: gauges each second, a split at 2.5 s, a processor killed
    at 5 s and restarted at 6 s."""
    run = Run.clean()
    for second in range(1, 10):
        active = {"input": 2 + (second >= 3), "out-a": 2, "out-b": 2}
        run.events.append(
            event("gauges", client="orchestrator", ts=float(second), backlog=3 - min(3, second),
                  fed=3, active=active)
        )  # fmt: skip
    run.events += [
        event("topology", client="orchestrator", ts=2.5, op="split", topic="topic://v/r/input"),
        event("killed", client="orchestrator", ts=5.0, victim="p2"),
        event("fault", client="orchestrator", ts=6.0, fault="kill-processor", target="p2",
              step="restarted"),
        event("ended", client="p2", ts=9.5, txn="T9", outcome="aborted", inputs=[], outputs=0,
              commit_ms=1.0),
    ]  # fmt: skip
    return run


async def report_of(run: Run, spark: SparkSession, run_dir: Path) -> Path:
    """The run's files, checked, and its report written as a run's job does it: in a thread
    of its own (Spark's calls and the screenshot's browser block)."""

    def write() -> None:
        run.write(run_dir, ["12:00:00 INFO segtxn.broker.service: started"])
        info = RunInfo("http://127.0.0.1:1", "r1", {}, {"seed": 1}, started=0.0, drained=True)
        write_report(check(run.frames(spark, run_dir)), 10.0, run_dir, info)

    await asyncio.to_thread(write)
    return run_dir / "report.html"


BOXES = """selector => [...document.querySelectorAll('svg')].map(svg =>
    [...svg.querySelectorAll(selector)].map(t => {
        const r = t.getBoundingClientRect();
        return [t.textContent, r.left, r.top, r.right, r.bottom];
    }))"""


async def overlaps(tab: Page, selector: str) -> list[tuple[str, str]]:
    """Pairs of elements matching ``selector`` in one SVG whose rendered boxes intersect
    (as the browser laid them out)."""
    found = []
    for boxes in await tab.evaluate(BOXES, selector):
        for (a, *box_a), (b, *box_b) in itertools.combinations(boxes, 2):
            left_a, top_a, right_a, bottom_a = box_a
            left_b, top_b, right_b, bottom_b = box_b
            if left_a < right_b and left_b < right_a and top_a < bottom_b and top_b < bottom_a:
                found.append((a, b))
    return found


@pytest.mark.timeout(600)  # the whole check, on a shared machine
async def test_a_passing_run_renders_with_its_verdict_plots_and_screenshot(
    spark: SparkSession, tmp_path: Path
) -> None:
    page_path = await report_of(recorded_run(), spark, tmp_path)
    async with opened(page_path) as tab:
        verdict = tab.locator("#verdict")
        assert await verdict.is_visible()
        assert "PASS: no anomaly" in await verdict.inner_text()
        colour = await verdict.evaluate("e => getComputedStyle(e).backgroundColor")
        assert colour == "rgb(46, 125, 50)"
        for name in PLOTS:
            plot = tab.locator(f"#plot-{name} svg")
            assert await plot.is_visible(), name
            assert await plot.locator(".data").count() > 0, f"the {name} plot has no data"
            assert await plot.locator("text.mark").all_text_contents() == [
                "split input",
                "kill p2",
            ]
            assert await plot.locator("text.tick").count() >= 6, name  # x and y ticks
        assert await tab.locator("path.anomaly").count() == 0
        assert await overlaps(tab, "text.mark, text.tick") == []
    png = (tmp_path / "report.png").read_bytes()
    assert png.startswith(PNG_MAGIC)
    assert int.from_bytes(png[16:20], "big") == WIDTH_PX  # the IHDR chunk's width


@pytest.mark.timeout(600)
async def test_a_failing_run_shows_its_anomalies_on_the_timeline(
    spark: SparkSession, tmp_path: Path
) -> None:
    run = recorded_run()
    # T2 (begun at 2.0 s) aborted, and its output shows: an aborted read, and also a read of
    # a transaction never asked to commit, a second output of k1:0, out of order, in out-a
    # only (torn)
    run.output("a", 9, "k1", 0, "T2")
    async with opened(await report_of(run, spark, tmp_path)) as tab:
        verdict = tab.locator("#verdict")
        assert (await verdict.inner_text()).startswith(
            "FAIL: 5 anomalies (aborted_read 1, uncommitted_read 1, torn_transaction 1, "
            "duplicate 1, order_violation 1)"
        )
        colour = await verdict.evaluate("e => getComputedStyle(e).backgroundColor")
        assert colour == "rgb(198, 40, 40)"
        found = tab.locator("#anomalies tr.found")
        assert await found.count() == 5
        aborted = found.filter(has_text="aborted_read")
        assert "#1 at 2.0 s: txn=T2" in await aborted.inner_text()
        timeline = tab.locator("svg[aria-label='timeline of faults and anomalies']")
        assert await timeline.locator("text", has_text="aborted_read #1").is_visible()
        for svg in [timeline, *(tab.locator(f"#plot-{name} svg") for name in PLOTS)]:
            assert await svg.locator("path.anomaly").count() == 5
            [marker] = await svg.locator("path.anomaly[data-anomaly='aborted_read']").all()
            box = await marker.bounding_box()
            assert box is not None
            assert abs(box["x"] + box["width"] / 2 - await x_of(svg, 2.0)) < 2, "not at 2.0 s"
        assert await overlaps(tab, "text") == []
    assert (tmp_path / "report.png").read_bytes().startswith(PNG_MAGIC)


async def x_of(svg: Locator, seconds: float) -> float:
    """Where ``seconds`` is on an SVG's time axis, from where two of its tick labels are."""
    centres = {}
    for tick in await svg.locator("text.tick").all():
        label = await tick.text_content() or ""
        box = await tick.bounding_box()
        if label.endswith(" s") and box is not None:
            centres[float(label[:-2])] = box["x"] + box["width"] / 2
    (s0, x0), (s1, x1) = sorted(centres.items())[:2]
    return x0 + (seconds - s0) / (s1 - s0) * (x1 - x0)
