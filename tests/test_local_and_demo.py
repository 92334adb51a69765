"""The per-user local backend and the demo, as a newcomer meets them."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

from cortex_nb import Client
from cortex_nb.demo import PROMPT, demo_text


def test_local_starts_once_and_is_reused_with_the_users_own_token(tmp_path):
    import getpass
    import stat

    first = Client.local(tmp_path)
    try:
        second = Client.local(tmp_path)
        assert second.url == first.url and first.local_backend.started
        assert not second.local_backend.started and second.local_backend.pid == first.local_backend.pid
        me = first.whoami()
        assert me["owner"] == getpass.getuser() and me["scopes"] == ["jobs:read", "jobs:write", "runs:write"]
        state = json.loads((tmp_path / "backend.json").read_text())
        assert stat.S_IMODE((tmp_path / "backend.json").stat().st_mode) == 0o600
        assert state["url"] == first.url and state["pid"] == first.local_backend.pid
        assert state["token_file"] == str(tmp_path.resolve() / "user.token")
        assert (
            state["data_dir"] == str(tmp_path.resolve()) and state["api_version"] and state["started_at"] > 0
        )
    finally:
        first.local_backend.stop()
    assert not (tmp_path / "backend.json").exists()


def test_demo_shows_loss_falling_and_the_text_appearing(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "cortex_nb.cli", "demo", "--steps", "80", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    first, last = map(float, re.search(r"loss/token ([\d.]+) -> ([\d.]+)", result.stdout).groups())
    assert last < first / 5
    after = ast.literal_eval(re.search(r"greedy sample after: +('.*')", result.stdout).group(1))
    # The model now continues the prompt with the shipped text, all 96 sampled tokens of it.
    assert len(after) == 96 and PROMPT + after in demo_text(), after
    # The job ended done with its adapter saved as `final` before the demo stopped the backend.
    job_id, status, checkpoints = re.search(r"job (\S+): (\w+), checkpoints (\[.*\])", result.stdout).groups()
    assert status == "done" and "final" in ast.literal_eval(checkpoints), result.stdout
    assert not (tmp_path / "backend.json").exists()  # the demo stopped the local backend it started
    # Started again, the store still says so (not `failed (backend_restarted)`): the stop cut nothing short.
    client = Client.local(tmp_path)
    try:
        assert client.get_job(job_id)["status"] == "done"
        assert "final" in [row["checkpoint_id"] for row in client.list_checkpoints(job_id)]
    finally:
        client.local_backend.stop()


def test_cortex_local_dir_moves_the_default_data_dir(tmp_path, monkeypatch):
    """CI and scratch disks keep the embedded backend's store out of the user's home."""
    from cortex_nb.local import default_local_dir

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CORTEX_LOCAL_DIR", raising=False)
    assert default_local_dir() == tmp_path / "xdg" / "cortex-nb" / "local"
    monkeypatch.setenv("CORTEX_LOCAL_DIR", str(tmp_path / "scratch"))
    assert default_local_dir() == tmp_path / "scratch"
    client = Client.local()
    try:
        assert client.local_backend.data_dir == (tmp_path / "scratch").resolve()
        assert (tmp_path / "scratch" / "backend.json").exists()
    finally:
        client.local_backend.stop()


def test_demo_notebook_runs_the_quickstart_headless_and_writes_the_executed_copy(tmp_path):
    """The second way in: `cortex-nb demo --notebook` runs 01-quickstart top to bottom in a kernel of this
    Python, prints what each cell shows, and leaves an executed notebook to open."""
    import nbformat

    dest = tmp_path / "out" / "quickstart-run.ipynb"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cortex_nb.cli",
            "demo",
            "--notebook",
            str(dest),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"wrote the executed notebook to {dest}" in result.stdout
    assert "%%cortex train --wait -o job" in result.stdout  # each cell announced as it ran
    # Text progress, not a widget; the run keeps alive for the quiz after it (keep_alive in the spec).
    assert re.search(r"job-[0-9a-f]+ \(tiny\) sampling: 200/200 steps", result.stdout)
    accuracy = int(re.search(r"exact match on all 100 problems: (\d+)%", result.stdout).group(1))
    assert accuracy >= 50
    executed = nbformat.read(dest, as_version=4)
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code)
    assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert "application/vnd.jupyter.widget-view+json" not in dest.read_text()  # CORTEX_NONINTERACTIVE=1
    assert not (
        tmp_path / "data" / "backend.json"
    ).exists()  # the one-shot command stopped the backend it started


def test_demo_notebook_exits_1_naming_the_cell_that_failed(tmp_path, monkeypatch):
    import nbformat

    from cortex_nb import demo

    broken = tmp_path / "01-quickstart.ipynb"
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("print('fine')"), nbformat.v4.new_code_cell("1 / 0")]
    nbformat.write(notebook, broken)
    monkeypatch.setattr(demo, "quickstart_notebook", lambda: broken)
    from cortex_nb.cli import main

    dest = tmp_path / "executed.ipynb"
    try:
        main(["demo", "--notebook", str(dest)])
    except SystemExit as exit:
        assert exit.code == 1
    else:
        raise AssertionError("a failing cell must fail the command")
    executed = nbformat.read(dest, as_version=4)  # written up to the failure, for a look
    assert executed.cells[0].outputs[0].text == "fine\n"
    assert executed.cells[1].outputs[-1].ename == "ZeroDivisionError"


def test_an_editable_install_finds_the_quickstart_in_the_checkout():
    """The wheel carries a copy (tests/test_wheel_install.py); a source checkout reads notebooks/ itself."""
    from pathlib import Path

    from cortex_nb.demo import quickstart_notebook

    assert (
        quickstart_notebook() == Path(__file__).resolve().parent.parent / "notebooks" / "01-quickstart.ipynb"
    )
