"""The JupyterLab panel in a real Chromium (Debian's, driven by Playwright) against a real `jupyter lab`
and a real backend training one `tiny` job: sidebar, job view with arriving logs, Cancel, the palette
commands, and "Open in sidebar" links from notebook outputs. Saves the README's screenshots."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from cortex_nb import Client, errors, routes

from .backend_process import start_backend
from .jupyter_process import start_jupyter_for

ROOT = Path(__file__).resolve().parent.parent
# Screenshots land in artifacts/ (ignored by git); copy them to docs/images/ to refresh the README's.
SCREENSHOTS = Path(os.environ.get("CORTEX_SCREENSHOT_DIR", ROOT / "artifacts" / "screenshots"))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]
BATCH = {"input_ids": [[1, 2, 3, 4, 5, 6]], "target_tokens": [[2, 3, 4, 5, 6, 7]], "weights": [[1] * 6]}


class Trainer(threading.Thread):
    """Keeps the job busy (forward_backward + step), so the engine logs a line per step."""

    def __init__(self, client: Client, job_id: str) -> None:
        super().__init__(daemon=True)
        self.client, self.job_id = client, job_id
        self.stop = threading.Event()
        self.steps = 0
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.client.poll_request(self.job_id, self.client.forward_backward(self.job_id, BATCH), timeout_s=60)
                self.client.poll_request(self.job_id, self.client.step(self.job_id, 1e-3), timeout_s=60)
                self.steps += 1
                self.stop.wait(0.4)
        except errors.CortexError as exc:  # the job was cancelled under it: expected at the end
            self.error = exc


@pytest.fixture(scope="module")
def lab_setup(tmp_path_factory):
    home = tmp_path_factory.mktemp("panel")
    backend = start_backend(home / "backend", "--devices", "cpu:2", "--worker-threads", "1")
    lab = start_jupyter_for(backend, home, app="lab")
    client = Client(backend.url, backend.token)
    yield backend, lab, client, home
    client.close()
    lab.stop()
    backend.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, lab_setup):
    _, lab, _, _ = lab_setup
    context = browser.new_context(viewport={"width": 1400, "height": 860})
    page = context.new_page()
    # Shown with a failing test's output: what the page logged, and failed calls to the extension.
    page.on("console", lambda message: print(f"console.{message.type}: {message.text}"))
    page.on("response", lambda response: print(f"HTTP {response.status} {response.url}") if response.status >= 400 else None)
    page.goto(f"{lab.url}lab?token={lab.token}")  # logs in: cookie session, so mutations carry XSRF
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    yield page
    context.close()


def _proxied(name: str) -> bool:
    route = routes.ROUTES_BY_NAME.get(name)
    return route is not None and route.proxied


def open_sidebar(page: Page) -> None:
    # The tab toggles, and JupyterLab may have restored the sidebar open from the last test's layout.
    if not page.locator("#cortex-nb-sidebar").is_visible():
        page.locator('.lm-TabBar-tab[data-id="cortex-nb-sidebar"]').click()
    expect(page.locator("#cortex-nb-sidebar")).to_be_visible()


def log_step_lines(page: Page) -> int:
    return len(re.findall(r"\[engine\] step=\d+", page.locator(".cortex-job-view .cortex-log").inner_text()))


def test_sidebar_job_view_logs_and_cancel(page, lab_setup):
    _, _, client, _ = lab_setup
    job = client.create_job([{"type": "training", "base_model": "tiny", "lora": {"r": 4}}], name="tiny-lora-demo")
    job_id = job["job_id"]
    client.wait_for_job(job_id, timeout_s=120)
    trainer = Trainer(client, job_id)
    trainer.start()
    try:
        open_sidebar(page)
        sidebar = page.locator("#cortex-nb-sidebar")
        expect(sidebar.locator(".cortex-connection")).to_have_attribute("data-state", "connected", timeout=30_000)
        expect(sidebar.locator('.cortex-device[data-device="cpu"]')).to_be_visible()
        expect(sidebar.locator(".cortex-device").first).to_contain_text("in use")
        expect(sidebar.locator('.cortex-device[data-device="cpu"]')).to_contain_text("sampling: transformers")
        row = sidebar.locator(f'.cortex-job[data-job-id="{job_id}"]')
        expect(row.locator(".cortex-badge")).to_have_text("running", timeout=30_000)
        expect(row).to_contain_text("tiny-lora-demo")
        expect(row).to_contain_text(re.compile(r"step \d+"), timeout=30_000)
        assert sidebar.locator(".cortex-warning").count() == 0  # versions match
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "jupyterlab-sidebar.png"))

        row.click()
        view = page.locator(".cortex-job-view")
        expect(view).to_be_visible()
        expect(view.locator(".cortex-job-header .cortex-badge")).to_have_text("running", timeout=30_000)
        expect(view.locator(".cortex-log")).to_contain_text("[engine] step=", timeout=30_000)
        seen = log_step_lines(page)
        # Lines keep arriving while the view is open (the log follower long-polls through the proxy).
        page.wait_for_function(
            "n => (document.querySelector('.cortex-job-view .cortex-log').innerText.match(/\\[engine\\] step=/g) || []).length > n",
            arg=seen, timeout=30_000)
        assert log_step_lines(page) > seen
        # Metrics and checkpoints: drawn when this backend serves them, otherwise the view says so.
        if _proxied("job_metrics"):
            # A line through at least two samples (a flat line has no height, so "visible" would not do).
            expect(view.locator("path.cortex-chart-line").first).to_have_attribute(
                "d", re.compile(r"^M[\d.]+,[\d.]+ L"), timeout=30_000)
        else:
            expect(view).to_contain_text("This backend does not serve job metrics yet.")
        if _proxied("host_metrics"):
            expect(sidebar.locator('.cortex-device[data-device="cpu"] [role="meter"][aria-valuenow]')).to_have_count(2, timeout=30_000)
        if _proxied("list_checkpoints"):
            client.poll_request(job_id, client.save(job_id, checkpoint_id="from-the-browser-test"), timeout_s=120)
            expect(view.locator('.cortex-job-checkpoints tr[data-checkpoint-id="from-the-browser-test"]')).to_be_visible(
                timeout=30_000)
        else:
            expect(view).to_contain_text("This backend does not list checkpoints yet.")
        page.screenshot(path=str(SCREENSHOTS / "jupyterlab-job-view.png"))

        view.locator(".cortex-cancel").click()
        expect(view.locator(".cortex-job-header .cortex-badge")).to_have_text("cancelled", timeout=30_000)
        assert client.get_job(job_id)["status"] == "cancelled"
        expect(view.locator(".cortex-cancel")).to_be_disabled()
        expect(row.locator(".cortex-badge")).to_have_text("cancelled", timeout=30_000)
    finally:
        trainer.stop.set()
        trainer.join(60)
        if client.get_job(job_id)["status"] not in ("cancelled", "done", "failed"):
            client.cancel_job(job_id)


def test_palette_lists_the_cortex_commands(page):
    search = page.locator(".lm-CommandPalette-input")
    page.locator("#jp-menu-panel").get_by_text("View", exact=True).click()
    page.locator(".lm-Menu-item").filter(has_text="Command Palette").first.click()
    expect(search).to_be_visible()
    search.fill("Cortex")
    items = page.locator(".lm-CommandPalette-item")
    expect(items.filter(has_text="Cortex: Refresh")).to_have_count(1)
    expect(items.filter(has_text="Cortex: Open job…")).to_have_count(1)
    items.filter(has_text="Cortex: Refresh").click()
    open_sidebar(page)
    expect(page.locator("#cortex-nb-sidebar .cortex-connection")).to_have_attribute("data-state", "connected", timeout=30_000)


def test_open_in_sidebar_link_in_a_notebook_output(page, lab_setup):
    _, lab, client, home = lab_setup
    job = client.create_job([{"type": "sampling", "base_model": "tiny"}], name="opened-from-notebook")
    job_id = job["job_id"]
    notebook = {
        "cells": [{
            "cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": ["from IPython.display import HTML\n",
                       f"HTML('<button class=\"cortex-open-in-sidebar\" data-cortex-open-job=\"{job_id}\">Open in sidebar</button>')"],
        }],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    (home / "jupyter" / "root" / "open-in-sidebar.ipynb").write_text(json.dumps(notebook))
    try:
        page.goto(f"{lab.url}lab/tree/open-in-sidebar.ipynb")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        expect(page.locator(".jp-StatusBar-Widget").filter(has_text=re.compile(r"\| Idle"))).to_have_count(1, timeout=60_000)
        page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").first.click()
        page.keyboard.press("Shift+Enter")
        button = page.locator(f'.jp-OutputArea [data-cortex-open-job="{job_id}"]')
        expect(button).to_be_visible(timeout=60_000)
        button.click()
        view = page.locator(f"#cortex-job-{job_id}")
        expect(view).to_be_visible(timeout=30_000)
        expect(view.locator(".cortex-job-header")).to_contain_text("opened-from-notebook", timeout=30_000)
        expect(page.locator("#cortex-nb-sidebar")).to_be_visible()
    finally:
        client.cancel_job(job_id)
