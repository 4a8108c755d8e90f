"""The checker's report: text for the terminal (:mod:`.text`), a self-contained HTML page
(:mod:`.page`, drawn from :mod:`.model`'s view with :mod:`.svg`'s plots and :mod:`.scale`'s
ticks) and a screenshot of it (:mod:`.screenshot`).

:func:`write_report` writes a run's ``report.txt``, ``report.html`` and, when a headless
Chromium is at hand, ``report.png``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from segtxn.verify.checker import Report
from segtxn.verify.report import screenshot
from segtxn.verify.report.page import render, write_html
from segtxn.verify.report.text import summary
from segtxn.verify.workload import RunInfo

__all__ = ["render", "summary", "write_html", "write_report"]

log = logging.getLogger(__name__)


def write_report(report: Report, run_s: float, run_dir: Path, info: RunInfo | None) -> Path | None:
    """``report.txt``, ``report.html`` and ``report.png`` in ``run_dir``; the PNG's path, or
    None when there was no browser to take it (logged, with why: the run is not failed)."""
    (run_dir / "report.txt").write_text(summary(report, run_s, info) + "\n")
    page = run_dir / "report.html"
    write_html(report, run_s, page, info)
    png = run_dir / "report.png"
    try:
        screenshot.take(page, png)
    except screenshot.ScreenshotError as e:
        log.info("no report.png: %s", e)
        return None
    return png
