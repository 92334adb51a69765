"""%%cortex run and %cortex runs in a real IPython shell against the real backend."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cortex_nb import Client
from cortex_nb.widgets import run_widget

from .notebook_fixtures import run_cell, wait_until

WRITER = """import json, sys
print("hello from the run")
print("to stderr", file=sys.stderr)
json.dump({"answer": 42, "items": [1, 2]}, open("result.json", "w"))
open("table.csv", "w").write("a,b\\n1,2\\n3,4\\n")
"""


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_run_shows_logs_and_brings_outputs_back_verified(cortex_shell, in_tmp):
    ran = run_cell(
        cortex_shell,
        "%%cortex run --wait --output result=result.json --output table=table.csv -o handle\n" + WRITER,
    )
    assert ran.success, ran.stderr
    handle = cortex_shell.user_ns["handle"]
    assert handle.info["status"] == "done"
    assert json.loads((in_tmp / "result.json").read_text()) == {"answer": 42, "items": [1, 2]}
    assert (in_tmp / "table.csv").read_text() == "a,b\n1,2\n3,4\n"
    widget = run_widget.SHOWN[handle.run_id]
    snap = widget.state.snapshot()
    assert "hello from the run" in snap.log_tail and "[stderr] to stderr" in snap.log_tail
    assert snap.status == "done" and snap.message.startswith(f"{handle.run_id} (cell) done, exit code 0")
    assert set(widget.saved) == {"result", "table"}
    shown = [output["data"] for output in widget.outputs.outputs]
    assert any('"answer": 42' in data.get("text/plain", "") for data in shown)  # JSON pretty-printed
    assert any("<table" in data.get("text/html", "") for data in shown)  # CSV as a DataFrame
    assert widget.cancel_button.disabled
    # Next to the widget view, a static picture of the finished run for when its model is gone.
    bundle = widget._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    picture = bundle["text/html"]
    assert 'class="cortex-run-static"' in picture and ">done</span>" in picture
    assert "hello from the run" in picture and "saved: result -&gt;" in picture


def test_noninteractive_run_prints_lines_summary_and_outputs(cortex_shell, in_tmp, monkeypatch):
    monkeypatch.setenv("CORTEX_NONINTERACTIVE", "1")
    ran = run_cell(cortex_shell, "%%cortex run --output result=result.json --name writer\n" + WRITER)
    assert ran.success, ran.stderr
    lines = ran.stdout.splitlines()
    assert "hello from the run" in lines and "[stderr] to stderr" in lines
    summary = next(line for line in lines if " (writer) done" in line)
    assert "exit code 0" in summary
    assert '"answer": 42' in ran.stdout  # displayed after download
    assert (in_tmp / "result.json").exists()


def test_a_failing_run_ends_the_cell_with_one_line(cortex_shell, in_tmp, monkeypatch):
    monkeypatch.setenv("CORTEX_NONINTERACTIVE", "1")
    ran = run_cell(cortex_shell, "%%cortex run\nprint('about to fail')\nraise SystemExit(3)\n")
    assert not ran.success
    assert "about to fail" in ran.stdout
    assert len(ran.error_lines) == 1
    assert ran.error_lines[0].startswith("UsageError: cortex run: [workload_runtime_failed]")


def test_cancel_button_cancels_the_run(cortex_shell, backend, in_tmp):
    ran = run_cell(
        cortex_shell,
        "%%cortex run --name sleeper\nimport time\nprint('sleeping', flush=True)\ntime.sleep(600)\n",
    )
    assert ran.success, ran.stderr
    handle = ran.result
    widget = run_widget.SHOWN[handle.run_id]
    wait_until(lambda: "sleeping" in widget.state.snapshot().log_tail, 60)
    widget.cancel_button.click()
    with Client(backend.url, backend.token) as client:
        wait_until(lambda: client.get_run(handle.run_id)["status"] == "cancelled", 60)
    widget.feed.join(30)
    assert not widget.feed.alive and widget.state.status == "cancelled" and not widget.saved
    runs = run_cell(cortex_shell, "%cortex runs --status cancelled").result
    assert isinstance(runs, pd.DataFrame) and handle.run_id in set(runs["run_id"])


def test_bad_run_options_print_one_line(cortex_shell, in_tmp):
    ran = run_cell(cortex_shell, "%%cortex run --output result.json\nprint(1)\n")
    assert not ran.success and len(ran.error_lines) == 1
    assert "--output takes NAME=PATH, not 'result.json'" in ran.error_lines[0]
