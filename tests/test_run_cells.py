"""What `%%cortex run` and the `cortex-nb run` command build on: a cell's code run as main.py, its
outputs downloaded next to the notebook and displayed by kind; the CLI with --wait and `runs`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
from IPython.display import Image, Pretty

from cortex_nb.run_outputs import fetch_and_display_outputs
from cortex_nb.runs import run_cell_source

from .run_projects import write_project

CELL = """
import json, os, struct, zlib
from helper import GREETING

def png(width, height, rgb):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")

json.dump({"greeting": GREETING, "accuracy": 0.75}, open("metrics.json", "w"))
os.makedirs("results", exist_ok=True)
open("results/table.csv", "w").write("step,loss\\n1,2.5\\n2,1.25\\n")
open("plot.png", "wb").write(png(4, 3, (255, 0, 0)))
print("cell done")
"""


def test_cell_source_runs_as_main_py_and_outputs_display_by_kind(runs_client, tmp_path):
    notebook_dir = tmp_path / "notebooks"
    notebook_dir.mkdir()
    (notebook_dir / "helper.py").write_text("GREETING = 'hello from helper.py'\n")
    (notebook_dir / "main.py").write_text("raise SystemExit('the cell replaces a main.py on disk')\n")
    handle = run_cell_source(
        runs_client,
        CELL,
        includes=["*.py"],
        workdir=notebook_dir,
        timeout_s=120,
        outputs={"metrics": "metrics.json", "table": "results/table.csv", "plot": "plot.png"},
    )
    assert handle.info["spec"]["command"] == ["python", "main.py"]
    assert handle.wait(120)["status"] == "done", handle.info
    assert "cell done" in handle.logs()

    shown = []
    paths = fetch_and_display_outputs(handle, notebook_dir, display=shown.append)
    assert paths == {
        "metrics": notebook_dir / "metrics.json",
        "table": notebook_dir / "results" / "table.csv",
        "plot": notebook_dir / "plot.png",
    }
    by_kind = {type(item): item for item in shown}
    pretty = by_kind[Pretty].data
    assert json.loads(pretty.split("\n", 1)[1]) == {"accuracy": 0.75, "greeting": "hello from helper.py"}
    assert "\n  " in pretty  # indented
    table = by_kind[pd.DataFrame]
    assert list(table.columns) == ["step", "loss"] and table["loss"].tolist() == [2.5, 1.25]
    image = by_kind[Image]
    assert image.format == "png" and image.data[:8] == b"\x89PNG\r\n\x1a\n"


def _cli(backend, *args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "CORTEX_URL": backend.url, "CORTEX_TOKEN": backend.token}
    return subprocess.run(
        [sys.executable, "-m", "cortex_nb.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=180,
    )


def test_cli_run_wait_and_runs(runs_backend, tmp_path):
    spec = write_project(
        tmp_path / "project",
        "import json; print('from the cli'); json.dump([1, 2], open('o.json', 'w'))",
        name="cli-run",
        outputs={"o": {"path": "o.json"}},
    )
    result = _cli(runs_backend, "run", str(spec), "--wait", "--outputs", str(tmp_path / "got"))
    assert result.returncode == 0, result.stderr
    assert "from the cli" in result.stdout
    run_id = result.stdout.split()[1]
    assert f"run {run_id} done; exit code 0" in result.stdout
    assert json.loads((tmp_path / "got" / "o.json").read_text()) == [1, 2]

    failing = write_project(tmp_path / "failing", "raise SystemExit(4)", name="cli-fail")
    result = _cli(runs_backend, "run", str(failing), "--wait")
    assert result.returncode == 1 and "workload_runtime_failed" in result.stdout

    queued = _cli(runs_backend, "run", str(spec))
    assert queued.returncode == 0 and queued.stdout.startswith("run run-")

    listing = _cli(runs_backend, "runs", "--limit", "5")
    assert listing.returncode == 0
    assert run_id in listing.stdout and "cli-fail" in listing.stdout

    bad = _cli(runs_backend, "run", str(tmp_path / "nowhere.yaml"))
    assert bad.returncode == 2 and "spec_invalid" in bad.stderr
