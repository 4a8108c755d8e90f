"""The report's screenshot: taken by the real headless Chromium when there is one, and when
there is none (or it fails) the run keeps its report.html, says why, and leaves no PNG."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from segtxn.verify.checker import ANOMALIES, Report
from segtxn.verify.report import write_report
from segtxn.verify.report.model import verdict
from segtxn.verify.report.screenshot import (
    CHROMIUM_ENV,
    ScreenshotError,
    ScreenshotUnavailable,
    chromium,
    take,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def empty_report() -> Report:
    return Report(dict.fromkeys(ANOMALIES, 0), {})


@pytest.mark.timeout(300)  # a browser start on a shared machine
def test_the_report_and_its_screenshot_are_written_side_by_side(tmp_path: Path) -> None:
    png = write_report(empty_report(), 1.0, tmp_path, None)
    assert png == tmp_path / "report.png"
    assert png.read_bytes().startswith(PNG_MAGIC)
    # its last line is the verdict (an empty run's: nothing was checked)
    text = (tmp_path / "report.txt").read_text()
    assert text.rstrip().endswith(verdict(empty_report(), None).headline)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.png", "report.txt"]


def test_without_a_browser_the_run_keeps_its_page_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(CHROMIUM_ENV, str(tmp_path / "no-such-chromium"))
    with caplog.at_level(logging.INFO, logger="segtxn.verify.report"):
        assert write_report(empty_report(), 1.0, tmp_path, None) is None
    assert (tmp_path / "report.html").is_file() and not (tmp_path / "report.png").exists()
    assert f"no report.png: ${CHROMIUM_ENV}={tmp_path / 'no-such-chromium'}" in caplog.text


def test_no_chromium_on_the_path_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHROMIUM_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ScreenshotUnavailable, match="no chromium on the PATH"):
        chromium()


@pytest.mark.timeout(300)
def test_a_browser_that_fails_leaves_no_png(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CHROMIUM_ENV, "/bin/false")  # a file that is no browser
    page = tmp_path / "report.html"
    page.write_text("<!doctype html><p>hello</p>")
    with pytest.raises(ScreenshotError, match="chromium \\(/bin/false\\)"):
        take(page, tmp_path / "report.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
