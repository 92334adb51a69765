"""The job widget in a real JupyterLab, in a real Chromium: a notebook connects through the Jupyter
proxy, runs `%%cortex train`, and the widget shows the run live; its "Open in sidebar" opens the
panel's job view, Save checkpoint and Cancel act on the backend. Saves a screenshot of the widget
under artifacts/screenshots (or $CORTEX_SCREENSHOT_DIR); docs/images holds the README's copy."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect, sync_playwright

from cortex_nb import Client

from .backend_process import start_backend
from .jupyter_process import start_jupyter_for
from .notebook_fixtures import DEMO_TEXT, wait_until
from .browser import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS

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
            expect(badge).to_have_text("done", timeout=300_000)
            expect(widget).to_contain_text("step 80/80")
            expect(widget.locator("svg[aria-label='loss per token'] polyline")).to_have_count(2)  # train and eval
            expect(widget.locator("svg[aria-label^='CPU / RAM'] polyline")).to_have_count(2, timeout=30_000)
            expect(widget).to_contain_text("samples at step 80")
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            widget.screenshot(path=str(SCREENSHOTS / "job-widget.png"))

            job_id = widget.locator("[data-cortex-open-job]").get_attribute("data-cortex-open-job")
            assert job_id and job_id.startswith("job-")
            widget.locator("button.jupyter-button").filter(has_text="Save checkpoint").click()
            wait_until(lambda: [c["checkpoint_id"] for c in client.list_checkpoints(job_id)] == ["step-80"], 60)
            expect(widget).to_contain_text("saved checkpoint step-80", timeout=30_000)

            cancel = widget.locator("button.jupyter-button").filter(has_text="Cancel")
            cancel.click()
            wait_until(lambda: client.get_job(job_id)["status"] == "cancelled", 60)
            expect(cancel).to_be_disabled(timeout=30_000)
            expect(widget).to_contain_text("(job cancelled)", timeout=30_000)

            widget.locator(".cortex-open-in-sidebar").click()
            view = page.locator(f"#cortex-job-{job_id}")
            expect(view).to_be_visible(timeout=30_000)
            expect(view.locator(".cortex-job-header")).to_contain_text("widget-in-lab", timeout=30_000)
            expect(view.locator(".cortex-job-header .cortex-badge")).to_have_text("cancelled", timeout=30_000)
        finally:
            browser.close()
            client.close()
