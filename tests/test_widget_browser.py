"""The job widget in a real JupyterLab, in a real Chromium: a notebook connects through the Jupyter
proxy, runs `%%cortex train`, and the widget shows the run live. The log tail the user opens stays
open while the widget re-renders; the log scale redraws the loss; once training is over (kept alive)
Free device replaces Cancel, Save checkpoint acts on the backend, "Open in sidebar" opens the panel's
job view; Free device ends the job and the widget becomes its static final picture. Saves a
screenshot of the widget under artifacts/screenshots (or $CORTEX_SCREENSHOT_DIR); docs/images holds
the README's copy."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect, sync_playwright

from cortex_nb import Client

from .backend_process import start_backend
from .jupyter_process import start_jupyter_for
from .notebook_fixtures import DEMO_TEXT, wait_until
from .test_jupyter_panel_browser import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS

TRAIN_CELL = f"""%%cortex train -o job --name widget-in-lab
base_model: tiny
data: {DEMO_TEXT}
steps: 80
batch_size: 2
max_seq_len: 48
optimizer: {{lr: 0.003}}
lora: {{r: 16, alpha: 32}}
eval: {{every: 20, data: {DEMO_TEXT}}}
sample: {{every: 40, prompts: ["The lighthouse keeper"], max_tokens: 24}}
keep_alive: 10m
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    home = tmp_path_factory.mktemp("widget-lab")
    backend = start_backend(home / "backend", "--devices", "cpu:2", "--worker-threads", "1")
    server = start_jupyter_for(backend, home, app="lab")
    yield backend, server, home
    server.stop()
    backend.stop()


def test_widget_runs_live_in_jupyterlab_and_opens_the_sidebar(lab):
    backend, server, home = lab
    notebook = {
        "cells": [
            {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
             "source": ["%load_ext cortex_nb\n", "%cortex connect"]},
            {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": [TRAIN_CELL]},
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    (home / "jupyter" / "root" / "widget.ipynb").write_text(json.dumps(notebook))
    client = Client(backend.url, backend.token)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.on("console", lambda message: print(f"console.{message.type}: {message.text}"))
        try:
            page.goto(f"{server.url}lab/tree/widget.ipynb?token={server.token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            expect(page.locator(".jp-StatusBar-Widget").filter(has_text=re.compile(r"\| Idle"))).to_have_count(1, timeout=60_000)
            page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").first.click()
            page.keyboard.press("Shift+Enter")
            expect(page.locator(".jp-OutputArea").first).to_contain_text("through its cortex-nb proxy", timeout=60_000)
            page.keyboard.press("Shift+Enter")

            widget = page.locator(".cortex-job-widget")
            expect(widget).to_be_visible(timeout=60_000)
            badge = widget.locator(".cortex-status")
            # Live: the badge moves on while the cell has long returned, and the charts fill in.
            expect(badge).to_have_text("training", timeout=120_000)
            expect(widget.locator("svg polyline").first).to_be_visible(timeout=60_000)

            # The log tail, opened by a click, stays open through the re-renders that follow (it used
            # to snap shut within a quarter second: its <details> was rebuilt on every render).
            log_tail = widget.locator(".widget-accordion").filter(has_text="log tail")
            log_tail.locator(".jupyter-widget-Collapse-header").click()
            expect(log_tail.locator(".jupyter-widget-Collapse-contents pre")).to_be_visible(timeout=10_000)
            stats = widget.locator(".widget-html").filter(has_text=re.compile(r"^step \d+/80")).first
            before = stats.inner_text()
            expect(stats).not_to_have_text(before, timeout=60_000)  # a render later...
            expect(log_tail.locator(".jupyter-widget-Collapse-contents pre")).to_be_visible()  # ...still open
            expect(log_tail.locator(".jupyter-widget-Collapse-open")).to_have_count(1)

            # The charts follow the cell's width.
            chart = widget.locator("svg[aria-label^='loss per token']").first

            def chart_width() -> float:  # None-safe: a render may swap the SVG in between
                box = chart.bounding_box()
                return box["width"] if box else -1.0

            wait_until(lambda: chart_width() > 0, 10)
            wide = chart_width()
            page.set_viewport_size({"width": 700, "height": 1000})
            wait_until(lambda: 0 < chart_width() < wide - 50, 10)
            page.set_viewport_size({"width": 1400, "height": 1000})
            wait_until(lambda: abs(chart_width() - wide) < 2, 10)

            widget.locator("button.jupyter-button").filter(has_text="log scale").click()
            expect(widget.locator("svg[aria-label='loss per token (log scale)'] polyline").first).to_be_visible(
                timeout=10_000)

            # Training over, kept alive for sampling: nothing red to click, Free device instead.
            expect(badge).to_have_text("sampling", timeout=300_000)
            expect(widget).to_contain_text("step 80/80")
            expect(widget).to_contain_text(re.compile(r"keep-alive, freeing the device in (10:00|9:[0-5]\d)"))
            expect(widget.locator("svg[aria-label='loss per token (log scale)'] polyline")).to_have_count(2)  # train, eval
            expect(widget.locator("svg[aria-label^='CPU / RAM'] polyline")).to_have_count(4, timeout=30_000)  # host, job
            expect(widget).to_contain_text("CPU host: no GPU metrics")
            expect(widget).to_contain_text("samples at step 80")
            cancel = widget.locator("button.jupyter-button", has_text=re.compile(r"^\s*Cancel\s*$"))
            free = widget.locator("button.jupyter-button", has_text=re.compile(r"^\s*Free device\s*$"))
            expect(cancel).to_have_count(1)
            expect(cancel).to_be_hidden()
            expect(free).to_be_visible()
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            widget.screenshot(path=str(SCREENSHOTS / "job-widget.png"))

            job_id = widget.locator("[data-cortex-open-job]").get_attribute("data-cortex-open-job")
            assert job_id and job_id.startswith("job-")
            widget.locator("button.jupyter-button").filter(has_text="Save checkpoint").click()
            wait_until(lambda: "step-80" in [c["checkpoint_id"] for c in client.list_checkpoints(job_id)], 60)
            expect(widget).to_contain_text("saved checkpoint step-80", timeout=30_000)

            free.click()
            wait_until(lambda: client.get_job(job_id)["status"] == "done", 60)
            # The ended job's widget is now its static picture: what a saved notebook keeps.
            picture = page.locator(".cortex-job-static")
            expect(picture).to_be_visible(timeout=30_000)
            expect(widget).to_have_count(0)
            expect(picture.locator(".cortex-status")).to_have_text("done")
            expect(picture).to_contain_text("step 80/80")
            expect(picture.locator("img[alt^='loss per token (log scale)']")).to_be_visible()
            expect(picture.locator("details[open] pre")).to_contain_text("[engine]")  # the log tail, left open

            picture.locator(".cortex-open-in-sidebar").click()  # the picture's button still opens the job
            view = page.locator(f"#cortex-job-{job_id}")
            expect(view).to_be_visible(timeout=30_000)
            expect(view.locator(".cortex-job-header")).to_contain_text("widget-in-lab", timeout=30_000)
            expect(view.locator(".cortex-job-header .cortex-badge")).to_have_text("done", timeout=30_000)
        finally:
            browser.close()
            client.close()
