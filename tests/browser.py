"""What the browser tests share: Debian's Chromium (driven by Playwright, never a downloaded browser),
its flags, where screenshots go, and opening the Cortex sidebar."""

from __future__ import annotations

import os
from pathlib import Path

from playwright.sync_api import Page, expect

ROOT = Path(__file__).resolve().parent.parent
# Screenshots land in artifacts/ (ignored by git); copy them to docs/images/ to refresh the README's.
SCREENSHOTS = Path(os.environ.get("CORTEX_SCREENSHOT_DIR", ROOT / "artifacts" / "screenshots"))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def open_sidebar(page: Page) -> None:
    # The tab toggles, and JupyterLab may have restored the sidebar open from an earlier layout.
    if not page.locator("#cortex-nb-sidebar").is_visible():
        page.locator('.lm-TabBar-tab[data-id="cortex-nb-sidebar"]').click()
    expect(page.locator("#cortex-nb-sidebar")).to_be_visible()


def retry_detached(action) -> None:
    """Runs a locator action again when its element was re-created under it.

    A job widget's view is re-created when its cell's picture is rewritten (each tenth of the steps): the
    locator then finds the new element on the next try.
    """
    from playwright.sync_api import Error

    for attempt in range(3):
        try:
            action()
            return
        except Error as exc:
            if "not attached" not in str(exc) or attempt == 2:
                raise


def scroll_to(target) -> None:
    """Scrolls an element into view, riding over its re-creation."""
    retry_detached(target.scroll_into_view_if_needed)


def screenshot(target, name: str) -> None:
    """A page or element screenshot under SCREENSHOTS."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    retry_detached(lambda: target.screenshot(path=str(SCREENSHOTS / name)))
