"""The embedded backend and the demo, as a newcomer meets them."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time

from cortex_nb import Client
from cortex_nb.demo import PROMPT, demo_text


def test_local_starts_once_and_is_reused(tmp_path):
    first = Client.local(tmp_path)
    try:
        second = Client.local(tmp_path)
        assert second.url == first.url
        assert second._local_backend.process is None  # reused, not started again
        assert first.whoami()["owner"] == "admin"
    finally:
        first._local_backend.stop()
    assert not (tmp_path / "backend.json").exists()


def assert_exits_soon(pid: int, failure: str, within_s: float = 30) -> None:
    """Wait for `pid` to exit; if it does not, kill it (no stray backend outlives the test) and fail."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(failure)


def test_the_embedded_backend_follows_its_parent(tmp_path):
    """A kernel killed without cleanup does not leave its backend running."""
    code = f"from cortex_nb import Client; c = Client.local({str(tmp_path)!r}); print(c.url, flush=True); import time; time.sleep(600)"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().startswith("http://127.0.0.1:")
        backend_pid = json.loads((tmp_path / "backend.json").read_text())["pid"]
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert_exits_soon(backend_pid, "the embedded backend outlived its parent")
    finally:
        parent.kill()


def test_demo_shows_loss_falling_and_the_text_appearing(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "cortex_nb.cli", "demo", "--steps", "80", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    first, last = map(float, re.search(r"loss/token ([\d.]+) -> ([\d.]+)", result.stdout).groups())
    assert last < first / 5
    after = ast.literal_eval(re.search(r"greedy sample after: +('.*')", result.stdout).group(1))
    # The model now continues the prompt with the shipped text, all 96 sampled tokens of it.
    assert len(after) == 96 and PROMPT + after in demo_text(), after
    assert not (tmp_path / "backend.json").exists()  # the embedded backend stopped with the demo


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
        assert client._local_backend.data_dir == (tmp_path / "scratch").resolve()
        assert (tmp_path / "scratch" / "backend.json").exists()
    finally:
        client._local_backend.stop()


def test_demo_notebook_runs_the_quickstart_headless_and_writes_the_executed_copy(tmp_path):
    """The second way in: `cortex-nb demo --notebook` runs 01-quickstart top to bottom in a kernel of this
    Python, prints what each cell shows, and leaves an executed notebook to open."""
    import nbformat

    dest = tmp_path / "out" / "quickstart-run.ipynb"
    result = subprocess.run(
        [sys.executable, "-m", "cortex_nb.cli", "demo", "--notebook", str(dest), "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"wrote the executed notebook to {dest}" in result.stdout
    assert "%%cortex train --wait -o job" in result.stdout  # each cell announced as it ran
    assert re.search(r"job-[0-9a-f]+ \(tiny\) done: 200/200 steps", result.stdout)  # text progress, not a widget
    accuracy = int(re.search(r"exact match on all 100 problems: (\d+)%", result.stdout).group(1))
    assert accuracy >= 50
    executed = nbformat.read(dest, as_version=4)
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code)
    assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert "application/vnd.jupyter.widget-view+json" not in dest.read_text()  # CORTEX_NONINTERACTIVE=1
    assert not (tmp_path / "data" / "backend.json").exists()  # its embedded backend stopped with the kernel


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


def test_the_embedded_backend_stops_when_its_parent_is_a_zombie(tmp_path):
    """A kernel that exited but was never reaped (its manager did not wait for it, or a container's init
    never reaps) still answers signal 0; the backend must see it is gone all the same."""
    code = (f"from cortex_nb import Client; import os; c = Client.local({str(tmp_path)!r}); print(c.url, flush=True);"
            " os._exit(0)")  # no atexit: only the parent watch can stop the backend
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().startswith("http://127.0.0.1:")
        backend_pid = json.loads((tmp_path / "backend.json").read_text())["pid"]
        assert_exits_soon(backend_pid, "the embedded backend outlived its zombie parent")
        with open(f"/proc/{parent.pid}/stat") as stat:  # the parent really was a zombie all along
            assert stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        parent.wait()


def test_an_editable_install_finds_the_quickstart_in_the_checkout():
    """The wheel carries a copy (tests/test_wheel_install.py); a source checkout reads notebooks/ itself."""
    from pathlib import Path

    from cortex_nb.demo import quickstart_notebook

    assert quickstart_notebook() == Path(__file__).resolve().parent.parent / "notebooks" / "01-quickstart.ipynb"
