"""A PNG of the report page, taken by a real headless browser, kept with the run.

The picture is what a reader sees, without opening a browser: attached to an issue, or looked
at in a CI artefact. It needs the PyPI package ``playwright`` (the ``dev`` extra) and a
Chromium binary: ``$SEGTXN_CHROMIUM``, else ``chromium`` (Debian's package) or
``chromium-browser`` on the ``PATH``. Playwright's own browser download is not used. Without
either, :func:`take` raises :class:`ScreenshotUnavailable` and the run keeps its
``report.html`` alone: the report never fails a run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM_ENV = "SEGTXN_CHROMIUM"
WIDTH_PX = 1040
TIMEOUT_S = 60.0


class ScreenshotError(Exception):
    """No screenshot was taken (the message says why)."""


class ScreenshotUnavailable(ScreenshotError):
    """Nothing to take one with: playwright is not installed or no Chromium was found."""


def chromium() -> str:
    """The Chromium binary to drive. Raises ScreenshotUnavailable: none found."""
    configured = os.environ.get(CHROMIUM_ENV)
    if configured:
        if not Path(configured).is_file():
            raise ScreenshotUnavailable(f"${CHROMIUM_ENV}={configured}: no such file")
        return configured
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise ScreenshotUnavailable(
        f"no chromium on the PATH (apt-get install chromium, or set ${CHROMIUM_ENV})"
    )


def take(page: Path, png: Path) -> None:
    """Open ``page`` (an HTML file) in headless Chromium and save the whole page as ``png``.

    Raises:
        ScreenshotUnavailable: no playwright, or no Chromium.
        ScreenshotError: the browser failed (it did not start, or the page did not load in
            :data:`TIMEOUT_S`); no PNG is left behind.
    """
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as e:
        raise ScreenshotUnavailable("playwright is not installed (pip install playwright)") from e
    executable = chromium()
    partial = png.with_name(png.name + ".partial")
    try:
        with sync_playwright() as p:
            # --no-sandbox: root in a container has no user namespace for Chromium's sandbox;
            # the page is our own file, with no script.
            browser = p.chromium.launch(
                executable_path=executable, args=["--no-sandbox"], timeout=TIMEOUT_S * 1000
            )
            try:
                tab = browser.new_page(viewport={"width": WIDTH_PX, "height": 900})
                tab.goto(page.resolve().as_uri(), timeout=TIMEOUT_S * 1000)
                tab.screenshot(
                    path=str(partial), type="png", full_page=True, timeout=TIMEOUT_S * 1000
                )
            finally:
                browser.close()
    except Error as e:
        partial.unlink(missing_ok=True)
        raise ScreenshotError(f"chromium ({executable}): {e.message}") from e
    partial.replace(png)
