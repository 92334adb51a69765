"""Notebook work that outlives the kernel, as a new user meets it: a real `jupyter lab` with a fresh HOME
and no cortex settings at all (so the documented defaults are what runs), driven by Debian's Chromium
through Playwright, one per-user local backend started by the first notebook that needs it.

The tests are one story in steps, sharing one JupyterLab, one browser page and one local backend (a
JupyterLab and a backend start once per module, which is what keeps this affordable on two cores).
Each step asserts its own outcome. Screenshots land in artifacts/screenshots (or $CORTEX_SCREENSHOT_DIR);
docs/images holds the README's copies.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from .jupyter_process import local_dir_of, start_jupyter, stop_local_backend

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = Path(os.environ.get("CORTEX_SCREENSHOT_DIR", ROOT / "artifacts" / "screenshots"))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab for a user with HOME=`home` and nothing configured; notebooks live in home/root."""
    home = tmp_path_factory.mktemp("new-user")
    server = start_jupyter(home, None, None, app="lab", fresh_home=True)
    yield server, home
    server.stop()
    stop_local_backend(local_dir_of(home))


@pytest.fixture(scope="module")
def page(lab):
    server, _ = lab
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        # Shown with a failing test's output: what the page logged, and failed calls to the server.
        page.on("console", lambda message: print(f"console.{message.type}: {message.text}"))
        page.on("response", lambda r: print(f"HTTP {r.status} {r.url}") if r.status >= 400 else None)
        page.goto(f"{server.url}lab?token={server.token}")  # logs in: cookie session, so mutations carry XSRF
        page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
        yield page
        browser.close()


def open_sidebar(page: Page) -> None:
    if not page.locator("#cortex-nb-sidebar").is_visible():
        page.locator('.lm-TabBar-tab[data-id="cortex-nb-sidebar"]').click()
    expect(page.locator("#cortex-nb-sidebar")).to_be_visible()


def screenshot(target, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    target.screenshot(path=str(SCREENSHOTS / name))


def test_with_nothing_configured_the_sidebar_offers_to_start_the_local_backend(page, lab):
    _, home = lab
    open_sidebar(page)
    connection = page.locator("#cortex-nb-sidebar .cortex-connection")
    expect(connection).to_have_attribute("data-state", "no_local_backend", timeout=30_000)
    expect(connection.locator(".cortex-backend-source")).to_contain_text(str(local_dir_of(home) / "backend.json"))
    expect(connection.locator(".cortex-start-local")).to_have_text("Start local backend")
    expect(page.locator("#cortex-nb-sidebar .cortex-jobs")).to_contain_text("no jobs yet")

    connection.locator(".cortex-start-local").click()
    expect(connection).to_have_attribute("data-state", "connected", timeout=180_000)
    state = json.loads((local_dir_of(home) / "backend.json").read_text())
    expect(connection.locator(".cortex-backend-url")).to_have_text(state["url"])
    # The user's own token, not admin: the owner is the OS user, as for %cortex connect --local.
    expect(connection).not_to_contain_text("as admin")
    assert os.getsid(state["pid"]) == state["pid"]  # its own session: it belongs to no kernel or server
    screenshot(page.locator("#cortex-nb-sidebar"), "sidebar-started-local-backend.png")
