"""Notebook work that outlives the kernel, as a new user meets it: a real `jupyter lab` with a fresh HOME
and no cortex settings at all (so the documented defaults are what runs), driven by Debian's Chromium
through Playwright, one per-user local backend started by the first notebook that needs it.

The tests are one story in steps, sharing one JupyterLab, one browser page and one local backend (a
JupyterLab and a backend start once per module, which is what keeps this affordable on two cores).
Each step asserts its own outcome. The cell widget is checked on the way (live, kept alive, its log tail
staying open, log scale, charts that follow the cell's width, Save checkpoint, Free device, its final
picture) in a notebook that connects through the Jupyter server's proxy. Screenshots land in artifacts/screenshots (or $CORTEX_SCREENSHOT_DIR);
docs/images holds the README's copies.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from cortex_nb import Client
from cortex_nb.local import process_exited, running_endpoint

from .browser import CHROMIUM, CHROMIUM_ARGS, ROOT, open_sidebar, screenshot, scroll_to
from .jupyter_process import local_dir_of, start_jupyter, stop_local_backend
from .notebook_fixtures import wait_until


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab for a user with HOME=`home` and nothing configured; notebooks live in home/root."""
    home = tmp_path_factory.mktemp("new-user")
    built = ROOT / "cortex_nb" / "labextension"
    extra: tuple[str, ...] = ()
    if (built / "package.json").is_file():
        # The checkout's panel build, ahead of the installed copy (an editable install copies the panel
        # once, at install time): the panel under test is the one these sources build. JupyterLab takes
        # the first copy of an extension it finds, and its extra path comes first.
        (home / "panel").mkdir()
        (home / "panel" / "cortex-nb").symlink_to(built)
        extra = (f"--LabApp.extra_labextensions_path={home / 'panel'}",)
    server = start_jupyter(home, None, None, app="lab", fresh_home=True, extra_args=extra)
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


@pytest.fixture(autouse=True)
def screenshot_on_failure(request, page):
    """A failed step leaves a picture of the page (artifacts/screenshots/failed-<test>.png)."""
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed > failed:
        screenshot(page, f"failed-{request.node.name}.png")


def notebook(*cells: str) -> dict:
    return {
        "cells": [
            {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": [cell]}
            for cell in cells
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


CONNECT = "%load_ext cortex_nb\n%cortex connect --local"
PROBLEMS = "from cortex_nb.demo_data import addition_problems\nproblems = addition_problems()"


def train_cell(name: str, steps: int, lr: float, output: str, extra: str = "") -> str:
    return (
        f"%%cortex train -o {output} --name {name}\nbase_model: tiny\ndata: $problems\nlora: {{r: 16, alpha: 32}}\n"
        f"optimizer: {{lr: {lr}}}\nbatch_size: 25\nmax_seq_len: 16\nsteps: {steps}\nseed: 0\n{extra}"
    )


# Story state shared by the steps (ids of what earlier steps made).
STORY: dict[str, str] = {}


def local_client(home: Path) -> Client:
    """A client of the user's local backend with the user's token: what the sidebar and kernels see."""
    state = running_endpoint(local_dir_of(home) / "backend.json")
    assert state is not None, "no local backend runs"
    return Client(state["url"], Path(state["token_file"]).read_text().strip())


def job_named(client: Client, name: str) -> dict:
    jobs = [job for job in client.list_jobs(limit=200) if job["name"] == name]
    assert jobs, f"no job named {name}"
    return jobs[0]


def open_notebook(page: Page, server, name: str, kernel: bool = True) -> None:
    """Open a notebook from the server's root (the page reloads; open tabs and kernels stay)."""
    page.goto(f"{server.url}lab/tree/{name}")
    expect(
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-current").filter(has_text=name)
    ).to_have_count(1, timeout=60_000)
    expect(page.locator(".jp-NotebookPanel:visible .jp-Cell").first).to_be_visible(timeout=60_000)
    if kernel:
        expect(page.locator(".jp-StatusBar-Widget").filter(has_text=re.compile(r"\| Idle"))).to_have_count(
            1, timeout=120_000
        )
        accept_kernel_choice(page)


def accept_kernel_choice(page: Page, settle_ms: int = 1500) -> None:
    """Take the notebook's own kernel when JupyterLab asks which ("Select Kernel"): it asks when its kernel
    specs had not loaded yet as the notebook opened (a busy machine), though the notebook names its kernel."""
    dialog = page.locator(".jp-Dialog").filter(has_text="Select Kernel")
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < settle_ms / 1000:
        if dialog.count():
            dialog.locator(".jp-mod-accept").click()
            expect(dialog).to_have_count(0, timeout=30_000)
            quiet_since = time.monotonic()
        page.wait_for_timeout(250)


def menu(page: Page, top: str, item: str) -> None:
    page.locator("#jp-menu-panel").get_by_text(top, exact=True).click()
    page.locator(".lm-Menu-item").filter(has_text=item).first.click()


def select_cell(page: Page, index: int) -> None:
    """Select a cell in command mode (its prompt, not its editor, which JupyterLab may still be laying out)."""
    page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(index).locator(".jp-InputPrompt").click()


def run_cell(page: Page, index: int) -> None:
    """Run one cell (Shift+Enter in command mode) and see that it was queued or ran: a keystroke that reached
    no notebook (focus still elsewhere while JupyterLab settles) is pressed again."""
    prompt = page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(index).locator(".jp-InputPrompt")
    for _ in range(3):
        select_cell(page, index)
        page.keyboard.press("Shift+Enter")
        try:
            expect(prompt).to_have_text(re.compile(r"\[(\*|\d+)\]"), timeout=10_000)
            return
        except AssertionError:
            continue
    expect(prompt).to_have_text(re.compile(r"\[(\*|\d+)\]"))


def restart_kernel(page: Page, clear: bool = False) -> None:
    menu(page, "Kernel", "Restart Kernel and Clear Outputs of All Cells…" if clear else "Restart Kernel…")
    page.locator(".jp-Dialog .jp-mod-accept").click()
    expect(page.locator(".jp-StatusBar-Widget").filter(has_text=re.compile(r"\| Idle"))).to_have_count(
        1, timeout=120_000
    )


def dismiss_dialogs(page: Page, settle_ms: int = 2000) -> None:
    """Close the dialogs JupyterLab raised (e.g. "Error Starting Kernel"), as a user would, until none
    has come for `settle_ms`."""
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < settle_ms / 1000:
        if page.locator(".jp-Dialog").count():
            page.keyboard.press("Escape")
            quiet_since = time.monotonic()
        page.wait_for_timeout(250)


def activate_tab(page: Page, title: str) -> None:
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").filter(has_text=title).first.click()


def sidebar_row(page: Page, job_id: str):
    return page.locator(f'#cortex-nb-sidebar .cortex-job[data-job-id="{job_id}"]')


def step_of(text: str) -> int:
    found = re.search(r"step (\d+)", text)
    return int(found.group(1)) if found else -1


# 1 ------------------------------------------------------------------------------------------------
def test_with_nothing_configured_the_sidebar_offers_to_start_the_local_backend(page, lab):
    _, home = lab
    open_sidebar(page)
    connection = page.locator("#cortex-nb-sidebar .cortex-connection")
    expect(connection).to_have_attribute("data-state", "no_local_backend", timeout=30_000)
    expect(connection.locator(".cortex-backend-source")).to_contain_text(
        str(local_dir_of(home) / "backend.json")
    )
    expect(connection.locator(".cortex-start-local")).to_have_text("Start local backend")
    expect(page.locator("#cortex-nb-sidebar .cortex-jobs")).to_contain_text("no jobs yet")


# 2 ------------------------------------------------------------------------------------------------
def test_the_quickstart_starts_the_local_backend_and_the_sidebar_follows_its_job_live(page, lab):
    server, home = lab
    quickstart = json.loads((ROOT / "notebooks" / "01-quickstart.ipynb").read_text())
    (home / "root" / "01-quickstart.ipynb").write_text(json.dumps(quickstart))
    open_notebook(page, server, "01-quickstart.ipynb")
    open_sidebar(page)
    menu(page, "Run", "Run All Cells")

    # `%cortex connect --local` started the user's local backend; the sidebar sees it by itself.
    sidebar = page.locator("#cortex-nb-sidebar")
    expect(sidebar.locator(".cortex-connection")).to_have_attribute(
        "data-state", "connected", timeout=180_000
    )
    expect(sidebar.locator(".cortex-connection")).not_to_contain_text("as admin")
    # each device card names the engine its sampling sub-jobs run (the local backend: the built-in one)
    expect(sidebar.locator(".cortex-device").first).to_contain_text("sampling: transformers")
    state = running_endpoint(local_dir_of(home) / "backend.json")
    assert state is not None and os.getsid(state["pid"]) == state["pid"]  # its own session: no kernel's child
    STORY["backend_pid"] = str(state["pid"])

    row = sidebar.locator('.cortex-job[data-word="training"]').filter(has_text="quickstart-addition")
    expect(row).to_be_visible(timeout=180_000)
    job_id = row.get_attribute("data-job-id")
    STORY["quickstart"] = job_id
    expect(row.locator(".cortex-job-detail")).to_contain_text(re.compile(r"step \d+/200"))
    expect(row.locator("progress")).to_be_visible()
    expect(row.locator(".cortex-job-training")).to_contain_text("loss per token", timeout=60_000)
    # Far enough in that the loss curve has its shape (the README's sidebar picture).
    wait_until(lambda: step_of(row.locator(".cortex-job-detail").inner_text()) >= 100, 180, interval_s=0.5)
    widget = page.locator(".jp-NotebookPanel:visible .cortex-job-widget").first
    scroll_to(widget)
    screenshot(page, "jupyterlab-sidebar.png")
    screenshot(widget, "job-widget-training.png")

    row.click()
    view = page.locator(f"#cortex-job-{job_id}")
    expect(view).to_be_visible(timeout=30_000)
    # The tab carries the job's name.
    expect(
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").filter(has_text=f"quickstart-addition ({job_id})")
    ).to_have_count(1)
    chart = view.locator('svg[aria-label="loss per token"]')
    expect(chart.locator("path.cortex-chart-line").first).to_have_attribute(
        "d", re.compile(r"^M[\d.]+,[\d.]+ L"), timeout=60_000
    )
    expect(view.locator(".cortex-progress-label")).to_contain_text(re.compile(r"step \d+/200"))
    expect(view.locator(".cortex-log")).to_contain_text("step", timeout=60_000)
    # Device-seconds used, in the words the cell widget uses.
    expect(view.locator(".cortex-device-seconds")).to_contain_text("device-s", timeout=60_000)
    screenshot(page, "jupyterlab-job-view.png")

    # The notebook runs to its end: trained, sampled, checked, and the job completed.
    activate_tab(page, "01-quickstart.ipynb")
    outputs = page.locator(".jp-NotebookPanel:visible .jp-OutputArea")
    expect(outputs.filter(has_text="exact match on all")).to_have_count(1, timeout=300_000)
    expect(outputs.filter(has_text="Traceback")).to_have_count(0)
    finished = sidebar.locator(f'.cortex-training[data-job-id="{job_id}"]')
    expect(finished).to_be_visible(timeout=60_000)
    expect(finished.locator(".cortex-badge")).to_have_text("done")
    # The label the widget recorded its cell in (set when the cell ran) is the tool's own, not a tag.
    expect(finished).not_to_contain_text("cell_display")
    # The Devices section says this user's device time over the week (GET /v1/stats, fetched once a minute).
    expect(sidebar.locator(".cortex-week-usage")).to_have_text(
        re.compile(r"your device-hours this week: \d+\.\d+ h"), timeout=90_000
    )
    # ... and how its sub-jobs run: a process each on this CPU host, forked from one process.
    expect(sidebar.locator(".cortex-host").filter(has_text="hosting:")).to_have_text(
        "hosting: a process per sub-job; CPU workers forked from one process"
    )
    expect(finished).to_contain_text(re.compile(r"loss per token [\d.]+ · took \d+:\d\d · 200/200 steps"))
    # Its view: the adapter the training ended with is a checkpoint, and the widget's final picture stays.
    activate_tab(page, "quickstart-addition")
    expect(view.locator('.cortex-job-checkpoints tr[data-checkpoint-id="final"]')).to_be_visible(
        timeout=60_000
    )
    expect(view.locator(".cortex-job-header .cortex-badge")).to_have_text("done")
    activate_tab(page, "01-quickstart.ipynb")
    # Ended, the widget leaves its final picture (what a saved notebook keeps).
    expect(page.locator(".jp-NotebookPanel:visible .cortex-job-static")).to_have_count(1, timeout=60_000)


# 3 ------------------------------------------------------------------------------------------------
def test_a_kernel_restart_leaves_the_run_going_and_job_reattaches_to_it(page, lab):
    server, home = lab
    (home / "root" / "long-run.ipynb").write_text(
        json.dumps(notebook(CONNECT + "\n" + PROBLEMS, train_cell("outlives-kernel", 3000, 0.002, "run")))
    )
    open_notebook(page, server, "long-run.ipynb")
    run_cell(page, 0)
    run_cell(page, 1)
    client = local_client(home)
    wait_until(lambda: any(job["name"] == "outlives-kernel" for job in client.list_jobs()), 120)
    job_id = job_named(client, "outlives-kernel")["job_id"]
    STORY["long_run"] = job_id
    widget = page.locator(".jp-NotebookPanel:visible .jp-OutputArea").nth(1)
    expect(widget).to_contain_text(re.compile(r"step [1-9]\d*/3000"), timeout=180_000)

    restart_kernel(page)  # the widget's kernel goes; its output stays
    restarted_at = time.monotonic()
    # The old cell's widget is cut off from its kernel: it shows the picture its output carries (where the
    # run was), never broken-link icons or a frozen Cancel.
    record = widget.locator(".cortex-cell-record")
    expect(record).to_contain_text(f"%cortex job {job_id} shows the run live", timeout=30_000)
    expect(record).to_contain_text("outlives-kernel")
    expect(widget.locator(".jupyter-widgets-disconnected:visible")).to_have_count(0)
    screenshot(widget, "old-cell-after-restart-shows-its-picture.png")
    step_then = (client.get_job(job_id)["progress"] or {}).get("step", 0)
    # The run is the backend's: it goes on without the kernel.
    wait_until(lambda: (client.get_job(job_id)["progress"] or {}).get("step", 0) > step_then + 3, 120)
    assert client.get_job(job_id)["status"] == "running"

    # Reattach from the restarted kernel: the widget shows the live run, advancing.
    run_cell(page, 0)
    select_cell(page, -1)
    page.keyboard.press("b")  # a new cell below
    page.keyboard.press("Enter")
    page.keyboard.type(f"%cortex job {job_id}")
    page.keyboard.press("Shift+Enter")
    reattached = (
        page.locator(".jp-NotebookPanel:visible .jp-Cell")
        # by its input: the old cell's picture names the same line (it says how to see the run live)
        .filter(has=page.locator(".jp-InputArea", has_text=f"%cortex job {job_id}"))
        .locator(".jp-OutputArea")
    )
    expect(reattached).to_contain_text(re.compile(r"step \d+/3000"), timeout=120_000)
    first = step_of(reattached.inner_text())
    assert first > step_then
    wait_until(lambda: step_of(reattached.inner_text()) > first, 120)
    screenshot(reattached, "reattached-widget.png")
    print(
        f"kernel restart -> reattached widget showing the live step: {time.monotonic() - restarted_at:.1f} s"
    )

    # Another notebook's kernel restarts: nothing else is disturbed.
    pid = int(STORY["backend_pid"])
    activate_tab(page, "01-quickstart.ipynb")
    restart_kernel(page)
    step_now = client.get_job(job_id)["progress"]["step"]
    wait_until(lambda: client.get_job(job_id)["progress"]["step"] > step_now + 3, 120)
    assert not process_exited(pid) and running_endpoint(local_dir_of(home) / "backend.json")["pid"] == pid
    assert client.get_job(STORY["quickstart"])["status"] == "done"
    activate_tab(page, "long-run.ipynb")
    shown = step_of(reattached.inner_text())
    wait_until(lambda: step_of(reattached.inner_text()) > shown, 120)

    # "Open in sidebar" on the widget opens the job's view; its Cancel asks first, trained steps would be
    # lost, and offers what the cell widget offers: Stop and save keeps them as checkpoint "final".
    reattached.locator(".cortex-open-in-sidebar").click()
    view = page.locator(f"#cortex-job-{job_id}")
    expect(view.locator(".cortex-cancel")).to_be_visible(timeout=30_000)
    expect(view.locator("button.cortex-save-checkpoint")).to_be_visible()
    view.locator(".cortex-cancel").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("would be lost")
    expect(dialog.get_by_role("button", name="Cancel and discard")).to_be_visible()
    stopped_from = client.get_job(job_id)["progress"]["step"]
    dialog.get_by_role("button", name="Stop and save").click()
    expect(view.locator(".cortex-job-header .cortex-badge")).to_have_text("stopped", timeout=120_000)
    ended = client.get_job(job_id)
    assert ended["status"] == "done" and ended["progress"]["step"] >= stopped_from
    assert ended["progress"]["last_checkpoint"] == "final"
    assert "final" in [row["checkpoint_id"] for row in client.list_checkpoints(job_id)]
    expect(view.locator(".cortex-job-detail")).to_have_text(
        f"at {ended['progress']['step']}/3000 (checkpoint final)"
    )
    screenshot(view, "sidebar-stop-and-save.png")

    # The first cell's record: its kernel is gone, and the new one cannot reach it (JupyterLab forgot the
    # display id at the restart), so the panel rewrites it with the final picture and where the run went.
    activate_tab(page, "long-run.ipynb")
    prompt = page.locator(".jp-NotebookPanel:visible .jp-Cell").filter(
        has=page.locator(".jp-InputArea", has_text=f"%cortex job {job_id}")
    )
    cell_number = re.search(r"\d+", prompt.locator(".jp-InputPrompt").inner_text()).group(0)
    expect(widget).to_contain_text(f"continued in cell {cell_number}:", timeout=60_000)
    expect(widget).to_contain_text(f"stopped at {ended['progress']['step']}/3000")
    expect(widget.locator(".cortex-picture-note")).to_have_count(0)
    screenshot(widget, "old-cell-continued-with-final-picture.png")
    widget.click()
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    saved = home / "root" / "long-run.ipynb"
    wait_until(lambda: "continued in cell" in saved.read_text(), 60)
    first_record = "".join(json.loads(saved.read_text())["cells"][1]["outputs"][0]["data"]["text/html"])
    assert f"continued in cell {cell_number}:" in first_record and "cortex-picture-note" not in first_record
    client.close()


# 4 ------------------------------------------------------------------------------------------------
# The first four take the local backend's four CPU slots: each trains briefly, then keeps its device for
# sampling (keep_alive), sweep-1 until it is freed from its widget, sweep-2 from its view, the others by the
# test. sweep-5 is submitted once all four hold their slot. This notebook connects with a bare `%cortex
# connect`: through the Jupyter server's proxy, to the same local backend.
SWEEP = [
    ("sweep-1", 60, 0.003),
    ("sweep-2", 10, 0.0005),
    ("sweep-3", 10, 0.001),
    ("sweep-4", 10, 0.002),
    ("sweep-5", 30, 0.0005),
]


def countdown(widget) -> str:
    found = re.search(r"freeing the device in (\d+:\d\d)", widget.inner_text())
    return found.group(1) if found else ""


def test_a_fifth_training_waits_saying_why_and_starts_when_one_ends(page, lab):
    server, home = lab
    sampled = 'eval: {data: $problems, every: 10}\nsample: {every: 30, prompts: ["2+3="], max_tokens: 3}\n'
    extra = {
        "sweep-1": sampled + "keep_alive: 10m\n",
        "sweep-2": "keep_alive: 10m\n",
        "sweep-3": "keep_alive: 10m\n",
        "sweep-4": "keep_alive: 10m\n",
        "sweep-5": sampled,
    }
    trains = [
        train_cell(name, steps, lr, f"s{i + 1}", extra.get(name, ""))
        for i, (name, steps, lr) in enumerate(SWEEP)
    ]
    cells = [
        "%load_ext cortex_nb\n%cortex connect\n" + PROBLEMS,
        *trains[:4],
        "for run in (s1, s2, s3, s4):\n    run.wait_ready()",
        trains[4],
        "for run in (s1, s5):\n    run.wait()",
        "import cortex_nb\ncortex_nb.compare([s1, s5], max_tokens=3)",
    ]
    (home / "root" / "sweep.ipynb").write_text(json.dumps(notebook(*cells)))
    open_notebook(page, server, "sweep.ipynb")
    # Up to the fifth training; the last two cells wait and compare, later (step 5). A kernel busy in a cell
    # takes no widget clicks (ipywidgets' messages queue behind it), so the widgets are used with it idle.
    select_cell(page, 7)
    menu(page, "Run", "Run All Above Selected Cell")
    outputs = [
        page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(i).locator(".jp-OutputArea")
        for i in range(len(cells))
    ]
    expect(outputs[0]).to_contain_text("through its cortex-nb proxy", timeout=120_000)

    client = local_client(home)
    names = {name for name, *_ in SWEEP}
    wait_until(lambda: len([job for job in client.list_jobs() if job["name"] in names]) == 5, 300)
    ids = {name: job_named(client, name)["job_id"] for name, *_ in SWEEP}
    STORY.update(ids)
    # While it waits, its widget and the sidebar say why and where in the queue.
    fifth_widget = outputs[6]
    expect(fifth_widget).to_contain_text("queued", timeout=120_000)
    expect(fifth_widget).to_contain_text(
        re.compile(r"#1 in the queue: waiting for a cpu slot: 4/4 held by .*sweep-1")
    )
    fifth = sidebar_row(page, ids["sweep-5"])
    expect(fifth).to_have_attribute("data-word", "queued", timeout=30_000)
    expect(fifth.locator(".cortex-job-detail")).to_contain_text(
        re.compile(r"#1 in the queue: waiting for a cpu slot: 4/4 held by .*sweep-1")
    )
    scroll_to(fifth_widget)
    screenshot(page, "jupyterlab-sidebar-queue.png")

    # sweep-1 has trained and keeps its device for sampling: its view offers Free device, not Cancel, and
    # its log, followed to the end, stays at the end while the view fills in.
    first = sidebar_row(page, ids["sweep-1"])
    expect(first).to_have_attribute("data-word", "sampling", timeout=300_000)
    expect(first.locator(".cortex-job-detail")).to_contain_text(
        re.compile(r"keep-alive, freeing the device in \d+:\d\d")
    )
    first.click()
    view = page.locator(f"#cortex-job-{ids['sweep-1']}")
    expect(view.locator(".cortex-free-device")).to_be_visible(timeout=30_000)
    expect(view.locator(".cortex-cancel")).to_have_count(0)
    expect(view.locator(".cortex-log")).to_contain_text("step=60", timeout=60_000)
    log = view.locator(".cortex-log")
    at_end = "n => n.scrollHeight > n.clientHeight && n.scrollTop + n.clientHeight >= n.scrollHeight - 8"
    try:
        wait_until(lambda: log.evaluate(at_end), 30)
    except AssertionError:
        where = log.evaluate("n => [n.scrollTop, n.clientHeight, n.scrollHeight].join()")
        raise AssertionError(
            f"the log is not at its end (scrollTop, clientHeight, scrollHeight: {where})"
        ) from None
    screenshot(page, "jupyterlab-job-view-keep-alive.png")

    # Its widget, kept alive: nothing red to click, Free device instead of Cancel.
    activate_tab(page, "sweep.ipynb")
    widget = outputs[1].locator(".cortex-job-widget")
    scroll_to(widget)
    expect(widget.locator(".cortex-status")).to_have_text("sampling", timeout=60_000)
    expect(widget).to_contain_text("step 60/60")
    expect(widget).to_contain_text("samples at step 60")
    expect(widget).to_contain_text("CPU host: no GPU metrics")
    expect(widget.locator("svg[aria-label^='CPU / RAM'] polyline")).to_have_count(
        4, timeout=30_000
    )  # host, job
    cancel = widget.locator("button.jupyter-button", has_text=re.compile(r"^\s*Cancel\s*$"))
    free = widget.locator("button.jupyter-button", has_text=re.compile(r"^\s*Free device\s*$"))
    expect(cancel).to_be_hidden()
    expect(free).to_be_visible()
    screenshot(widget, "job-widget.png")  # the README's
    # The log tail, opened by a click, stays open through the re-renders that follow (the countdown moves).
    log_tail = widget.locator(".widget-accordion").filter(has_text="log tail")
    log_tail.locator(".jupyter-widget-Collapse-header").click()
    expect(log_tail.locator(".jupyter-widget-Collapse-contents pre")).to_be_visible(timeout=10_000)
    shown = countdown(widget)
    wait_until(lambda: countdown(widget) not in ("", shown), 30)  # a render later...
    expect(log_tail.locator(".jupyter-widget-Collapse-open")).to_have_count(1)  # ...still open
    # The log scale redraws the loss (train and eval); the charts follow the cell's width.
    widget.locator("button.jupyter-button").filter(has_text="log scale").click()
    expect(widget.locator("svg[aria-label='loss per token (log scale)'] polyline")).to_have_count(
        2, timeout=10_000
    )
    chart = widget.locator("svg[aria-label^='loss per token']").first

    def chart_width() -> float:  # None-safe: a render may swap the SVG in between
        box = chart.bounding_box()
        return box["width"] if box else -1.0

    wait_until(lambda: chart_width() > 0, 30)
    wide = chart_width()
    page.set_viewport_size({"width": 700, "height": 900})
    wait_until(lambda: 0 < chart_width() < wide - 50, 30)
    page.set_viewport_size({"width": 1400, "height": 900})
    wait_until(lambda: abs(chart_width() - wide) < 2, 30)
    # Save checkpoint acts on the backend; Free device ends the job, and the widget becomes its final picture.
    widget.locator("button.jupyter-button").filter(has_text="Save checkpoint").click()
    wait_until(lambda: "step-60" in [c["checkpoint_id"] for c in client.list_checkpoints(ids["sweep-1"])], 60)
    expect(widget).to_contain_text("saved checkpoint step-60", timeout=30_000)
    free.click()
    picture = outputs[1].locator(".cortex-job-static")
    expect(picture).to_be_visible(timeout=60_000)
    expect(widget).to_have_count(0)
    expect(picture.locator(".cortex-status")).to_have_text("done")
    expect(picture).to_contain_text("step 60/60")
    expect(picture).to_contain_text("device freed")
    expect(picture.locator("img[alt^='loss per token (log scale)']")).to_be_visible()
    expect(picture.locator("details[open] pre")).to_contain_text("[engine]")  # the log tail, left open
    assert client.get_job(ids["sweep-1"])["status"] == "done"

    # The fifth starts as soon as sweep-1's slot is free, while the three others still hold theirs.
    expect(fifth_widget).to_contain_text(re.compile(r"training|done"), timeout=300_000)
    # sweep-1's slot frees once its worker has exited; the widget may say so before the fifth is placed.
    wait_until(lambda: client.get_job(ids["sweep-5"])["started_at"] is not None, 120)
    jobs = {name: client.get_job(job_id) for name, job_id in ids.items()}
    assert jobs["sweep-5"]["started_at"] >= jobs["sweep-1"]["finished_at"]
    assert [jobs[name]["status"] for name in ("sweep-2", "sweep-3", "sweep-4")] == ["running"] * 3
    # The picture's button still opens the job; sweep-2 is freed from its view.
    picture.locator(".cortex-open-in-sidebar").click()
    expect(view).to_be_visible(timeout=30_000)
    expect(view.locator(".cortex-job-header")).to_contain_text("sweep-1")
    expect(view.locator(".cortex-job-header .cortex-badge")).to_have_text("done", timeout=60_000)
    sidebar_row(page, ids["sweep-2"]).click()
    second = page.locator(f"#cortex-job-{ids['sweep-2']}")
    expect(second.locator(".cortex-free-device")).to_be_visible(timeout=30_000)
    second.locator(".cortex-free-device").click()
    expect(second.locator(".cortex-notice")).to_contain_text("Device freed", timeout=60_000)
    expect(second.locator(".cortex-job-header .cortex-badge")).to_have_text("done", timeout=60_000)
    for name in ("sweep-3", "sweep-4"):
        client.complete_job(ids[name])

    finished = page.locator("#cortex-nb-sidebar .cortex-trainings")
    for name, steps in (("sweep-1", 60), ("sweep-5", 30)):
        expect(finished.locator(f'.cortex-training[data-job-id="{ids[name]}"]')).to_contain_text(
            f"{steps}/{steps} steps", timeout=300_000
        )
    client.close()


# 5 ------------------------------------------------------------------------------------------------
def test_two_trainings_compared_in_the_sidebar_and_the_notebook(page, lab):
    # The notebook's last two cells (wait for both runs, compare them) run meanwhile.
    activate_tab(page, "sweep.ipynb")
    select_cell(page, 7)
    menu(page, "Run", "Run Selected Cell and All Below")
    finished = page.locator("#cortex-nb-sidebar .cortex-trainings")
    for name in ("sweep-1", "sweep-5"):
        finished.locator(f'.cortex-training[data-job-id="{STORY[name]}"] .cortex-compare-tick').check()
    finished.locator(".cortex-compare").click()
    view = page.locator(".cortex-compare-view")
    expect(view).to_be_visible(timeout=30_000)
    chart = view.locator('svg[aria-label="loss per token"]')
    expect(chart.locator("path.cortex-chart-line:not(.cortex-chart-dashed)")).to_have_count(2, timeout=30_000)
    expect(chart.locator("path.cortex-chart-dashed")).to_have_count(2)
    rows = view.locator(".cortex-compare-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("sweep-1")
    expect(view.locator(".cortex-compare-table th.cortex-differs")).to_have_text(["lr"])
    screenshot(page, "jupyterlab-compare.png")

    # The notebook's `cortex_nb.compare`: overlaid curves and an A/B table of samples.
    activate_tab(page, "sweep.ipynb")
    compared = page.locator(".jp-NotebookPanel:visible .cortex-compare-widget")
    expect(compared).to_be_visible(timeout=300_000)
    expect(compared).to_have_count(1)  # shown once
    expect(compared).to_contain_text("sweep-1")
    expect(compared.locator(".cortex-ab-token").first).to_be_attached(timeout=60_000)


# 6 ------------------------------------------------------------------------------------------------
def test_a_saved_notebook_shows_the_final_widget_picture_without_a_kernel(page, lab):
    import httpx

    server, home = lab
    activate_tab(page, "sweep.ipynb")
    page.keyboard.press("Control+s")
    saved = home / "root" / "sweep.ipynb"
    wait_until(lambda: saved.read_text().count("cortex-job-static") >= 5, 60)
    for kernel in httpx.get(f"{server.url}api/kernels", headers=server.headers()).json():
        httpx.delete(f"{server.url}api/kernels/{kernel['id']}", headers=server.headers())
    # Reopened with no kernel to be had: the browser may not start one.
    page.route(
        re.compile(r".*/api/(sessions|kernels).*"),
        lambda route: route.abort() if route.request.method == "POST" else route.continue_(),
    )
    try:
        open_notebook(page, server, "sweep.ipynb", kernel=False)
        dismiss_dialogs(page)  # "Error Starting Kernel"
        expect(page.locator(".jp-StatusBar-Widget").filter(has_text="No Kernel")).to_have_count(1)
        pictures = page.locator(".jp-NotebookPanel:visible .cortex-job-static")
        expect(pictures).to_have_count(5, timeout=60_000)
        expect(pictures.first.locator('img[alt^="loss per token"]')).to_be_visible()
        dismiss_dialogs(page)
        screenshot(pictures.first, "reopened-widget-picture.png")
    finally:
        page.unroute(re.compile(r".*/api/(sessions|kernels).*"))


# 7 ------------------------------------------------------------------------------------------------
def test_the_sidebar_notices_the_local_backend_go_and_starts_it_again(page, lab):
    _, home = lab
    dismiss_dialogs(page, settle_ms=500)
    pid = int(STORY["backend_pid"])
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: process_exited(pid), 60)
    connection = page.locator("#cortex-nb-sidebar .cortex-connection")
    expect(connection).to_have_attribute("data-state", "no_local_backend", timeout=30_000)
    connection.locator(".cortex-start-local").click()
    expect(connection).to_have_attribute("data-state", "connected", timeout=180_000)
    state = running_endpoint(local_dir_of(home) / "backend.json")
    assert state is not None and state["pid"] != pid
    # Started by the server, yet its own: its own session, tied to no process, the user's (not admin) token.
    assert os.getsid(state["pid"]) == state["pid"]
    assert "--parent-pid" not in Path(f"/proc/{state['pid']}/cmdline").read_text()
    assert Path(state["token_file"]).name == "user.token"
    expect(connection).not_to_contain_text("as admin")
    # The same store: finished trainings are still listed, as they really ended.
    finished = page.locator("#cortex-nb-sidebar .cortex-trainings")
    expect(
        finished.locator(f'.cortex-training[data-job-id="{STORY["sweep-1"]}"] .cortex-badge')
    ).to_have_text("done", timeout=30_000)
    expect(
        finished.locator(f'.cortex-training[data-job-id="{STORY["long_run"]}"] .cortex-badge')
    ).to_have_text("stopped")


def test_the_palette_lists_the_cortex_commands(page):
    dismiss_dialogs(page, settle_ms=500)
    menu(page, "View", "Command Palette")
    search = page.locator(".lm-CommandPalette-input")
    expect(search).to_be_visible()
    search.fill("Cortex")
    items = page.locator(".lm-CommandPalette-item")
    for label in ("Cortex: Refresh", "Cortex: Open job…", "Cortex: Compare trainings"):
        expect(items.filter(has_text=label)).to_have_count(1)
    page.keyboard.press("Escape")
