"""The sidebar's job comforts and checkpoint storage in real JupyterLab and Chromium, against the test
backend: filter by name or tag with the short-lived jobs hidden, tag and rename a run, insert
`%cortex job ID` into the open notebook, keep a checkpoint, delete all but `final` (after a dry run says
what would go), and a delete the backend refuses shown with its reason."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from cortex_nb import Client
from cortex_nb.protocol.states import SHORT_LIVED, format_bytes

from .browser import CHROMIUM, CHROMIUM_ARGS, ROOT, open_sidebar, screenshot
from .jupyter_process import start_jupyter_for
from .training_data import random_batches, train

TINY_VOCAB = 259


@pytest.fixture(scope="module")
def jobs(backend):
    """A finished run with checkpoints step-1, step-2 and final, and a short-lived compare job."""
    with Client(backend.url, backend.token) as client:
        run = client.create_training_job("tiny", name="sidebar-storage-run", lora={"r": 2}, seed=4)
        batches = random_batches(3, TINY_VOCAB, seed=6)
        for index, checkpoint in enumerate(("step-1", "step-2", "final")):
            train(run, batches[index : index + 1])
            run.save(checkpoint, "weights-only").result()
        run.complete(wait=True)
        compare = client.api.create_job(
            [{"type": "sampling", "base_model": "tiny"}],
            name="%cortex compare",
            labels=SHORT_LIVED["compare"],
        )
        client.cancel_job(compare["job_id"])
        yield client, run.job_id, compare["job_id"]


@pytest.fixture(scope="module")
def page(backend, jobs, tmp_path_factory):
    home = tmp_path_factory.mktemp("sidebar-storage")
    # The checkout's panel build ahead of the installed copy (as test_lab_new_user_browser does).
    built = ROOT / "cortex_nb" / "labextension"
    assert (built / "package.json").is_file(), "build the panel first: cd labextension && npm run build:prod"
    (home / "panel").mkdir()
    (home / "panel" / "cortex-nb").symlink_to(built)
    server = start_jupyter_for(
        backend, home, app="lab", extra_args=(f"--LabApp.extra_labextensions_path={home / 'panel'}",)
    )
    (home / "jupyter" / "root" / "scratch.ipynb").write_text(
        json.dumps(
            {
                "cells": [{"cell_type": "markdown", "metadata": {}, "source": ["scratch"]}],
                "metadata": {
                    "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
                },
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            page.on("console", lambda message: print(f"console.{message.type}: {message.text}"))
            page.goto(f"{server.url}lab/tree/scratch.ipynb?token={server.token}")
            expect(page.locator(".jp-NotebookPanel:visible .jp-Cell").first).to_be_visible(timeout=90_000)
            yield page
            browser.close()
    finally:
        server.stop()


def answer_dialog(page: Page, text: str | None = None) -> None:
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_be_visible(timeout=10_000)
    if text is not None:
        dialog.locator("input").fill(text)
    dialog.locator(".jp-mod-accept").click()
    expect(dialog).to_have_count(0)


def test_filter_tag_rename_insert_keep_and_prune_from_the_sidebar(page, jobs):
    client, run_id, compare_id = jobs
    open_sidebar(page)
    sidebar = page.locator("#cortex-nb-sidebar")
    run_row = sidebar.locator(f'.cortex-training[data-job-id="{run_id}"]')
    expect(run_row).to_be_visible(timeout=30_000)
    expect(run_row.locator(".cortex-job-id")).to_have_text(run_id)
    expect(run_row.locator(".cortex-job-identity")).to_contain_text("started 20")
    # The short-lived compare job is hidden until asked for.
    filter_box = sidebar.locator(".cortex-filter-text")
    compare_row = sidebar.locator(f'.cortex-job[data-job-id="{compare_id}"]')
    expect(compare_row).to_have_count(0)
    sidebar.locator(".cortex-filter-short-lived").check()
    expect(compare_row).to_have_count(1)
    sidebar.locator(".cortex-filter-short-lived").uncheck()
    expect(compare_row).to_have_count(0)

    # Tag, then filter by the tag; rename.
    run_row.locator('[data-action="tag"]').click()
    answer_dialog(page, "dataset=lamps, try=2")
    expect(run_row.locator(".cortex-tag")).to_have_text(["dataset=lamps", "try=2"], timeout=15_000)
    assert client.get_job(run_id)["labels"] == {"dataset": "lamps", "try": "2"}
    filter_box.fill("try=2")
    expect(sidebar.locator(".cortex-training")).to_have_count(1)
    run_row.locator('[data-action="rename"]').click()
    answer_dialog(page, "lamps, second try")
    expect(run_row.locator(".cortex-job-title")).to_have_text("lamps, second try", timeout=15_000)
    assert client.get_job(run_id)["name"] == "lamps, second try"

    # Insert `%cortex job ID` into the open notebook.
    run_row.locator('[data-action="insert"]').click()
    cells = page.locator(".jp-NotebookPanel:visible .jp-Cell")
    expect(cells).to_have_count(2)
    expect(cells.nth(1).locator(".cm-content")).to_have_text(f"%cortex job {run_id}")

    # Storage: the run's bytes, its checkpoints; keep step-1, then delete all but final.
    listed = client.list_checkpoints(run_id)
    storage_row = sidebar.locator(f'.cortex-storage-job[data-storage-job-id="{run_id}"]')
    expect(storage_row).to_contain_text(
        f"3 checkpoints · {format_bytes(sum(c['size_bytes'] for c in listed))}", timeout=15_000
    )
    expect(sidebar.locator(".cortex-storage-meter").first).to_contain_text("checkpoints")
    storage_row.locator(".cortex-storage-job-head").click()
    table_rows = storage_row.locator(".cortex-checkpoint-table tbody tr")
    expect(table_rows).to_have_count(3, timeout=15_000)
    storage_row.locator('tr[data-checkpoint-id="step-1"] .cortex-keep').check()
    expect(storage_row.locator(".cortex-storage-note")).to_contain_text("step-1 is kept", timeout=15_000)
    assert client.api.get_checkpoint(run_id, "step-1")["kept"] is True
    storage_row.locator(".cortex-prune-all").click()
    expect(page.locator(".jp-Dialog")).to_contain_text("Would delete 1 checkpoint")
    expect(page.locator(".jp-Dialog")).to_contain_text("step-1 (kept), final (final)")
    answer_dialog(page)
    expect(storage_row.locator(".cortex-storage-note")).to_contain_text(
        "Deleted 1 checkpoint", timeout=15_000
    )
    expect(table_rows).to_have_count(2, timeout=15_000)
    assert [c["checkpoint_id"] for c in client.list_checkpoints(run_id)] == ["step-1", "final"]
    screenshot(page, "jupyterlab-sidebar-storage.png")

    # Deleting the run is refused while it keeps step-1, and the dialog says why.
    run_row.locator('[data-action="delete"]').click()
    expect(page.locator(".jp-Dialog")).to_contain_text(f"{run_id}, its logs and its checkpoints are deleted")
    page.locator(".jp-Dialog .jp-mod-accept").click()
    error = page.locator(".jp-Dialog").filter(has_text="Delete job")
    expect(error).to_contain_text("checkpoint_kept", timeout=15_000)
    expect(error).to_contain_text("step-1")
    screenshot(page, "jupyterlab-sidebar-delete-refused.png")
    page.keyboard.press("Escape")
    expect(page.locator(".jp-Dialog")).to_have_count(0)
    assert client.get_job(run_id)["status"] == "done"
