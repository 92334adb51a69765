"""The example notebooks as git holds them, and the nbval wiring that runs them in CI.

The notebooks themselves run under nbval as part of `python -m pytest` (testpaths in pyproject.toml).
These tests pin what that run relies on: the notebooks are stored clean with their reference outputs,
each says how to point it at a GPU, the sanitizer masks what changes between runs, and a notebook
kernel gets the environment notebooks/conftest.py promises. They also show that the nbval run can
fail: a broken API call and a changed checked output both fail it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
EXPECTED = [
    "01-quickstart",
    "02-custom-training-loop",
    "03-sampling-and-logprobs",
    "04-rl-loop",
    "05-checkpoints-and-sync",
    "06-source-runs",
    "07-observability",
    "08-tinker-sdk",
]


def test_the_eight_notebooks_are_there_and_stored_clean():
    assert sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb")) == EXPECTED
    result = subprocess.run(
        [sys.executable, "scripts/notebooks.py", "check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


ABSOLUTE_PATH = re.compile(r"(?<![\w.~])/(?:tmp|home|root|work|Users|private|var/folders|opt|mnt|srv)/")


@pytest.mark.parametrize("name", EXPECTED)
def test_no_stored_output_holds_a_path_of_the_machine_that_ran_it(name):
    """Shipped outputs read the same on every machine: no /tmp/..., /home/..., /work/... of the build."""
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            texts = [output.get("text", "")] + [str(v) for v in (output.get("data") or {}).values()]
            for text in texts:
                assert not ABSOLUTE_PATH.search(text) and str(ROOT) not in text, (name, index, text)


def test_the_notebook_check_refuses_a_machine_path_and_strip_removes_it(tmp_path):
    notebook = nbformat.read(NOTEBOOKS / "01-quickstart.ipynb", as_version=4)
    cell = next(cell for cell in notebook.cells if cell.get("outputs"))
    cell.outputs[0]["text"] = (
        "connected via your local backend in /home/builder/.local/share/cortex-nb/local\n"
    )
    planted = tmp_path / "planted.ipynb"
    nbformat.write(notebook, planted)
    result = subprocess.run(
        [sys.executable, "scripts/notebooks.py", "check", str(planted)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "/home/builder/.local/share/cortex-nb/local" in result.stderr
    subprocess.run([sys.executable, "scripts/notebooks.py", "strip", str(planted)], cwd=ROOT, check=True)
    stripped = nbformat.read(planted, as_version=4)
    texts = [o.get("text", "") for c in stripped.cells for o in c.get("outputs", [])]
    assert "connected via your local backend in DATA_DIR\n" in texts  # nbval's sanitized form


@pytest.mark.parametrize("name", EXPECTED)
def test_each_notebook_says_what_it_shows_and_how_to_use_a_gpu(name):
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    first = notebook.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(f"# {name[:2]} · ")
    assert "cortex-nb backend serve" in first.source and (
        "--model qwen=" in first.source or "--model Qwen/" in first.source
    )
    # Ours connect with a profile; the Tinker SDK's notebook points the SDK's own client at the GPU host.
    assert (
        "%cortex connect PROFILE" in first.source
        or 'Client.from_profile("PROFILE")' in first.source
        or "tinker.ServiceClient(base_url=" in first.source
    )
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert "--local" in code or "Client.local()" in code  # runs on the local backend as written
    checked = [cell for cell in notebook.cells if "# NBVAL_CHECK_OUTPUT" in cell.source]
    assert checked, "every notebook compares at least one stable output"


def test_the_sanitizer_masks_what_changes_between_runs():
    from nbval.plugin import get_sanitize_patterns

    patterns = get_sanitize_patterns((NOTEBOOKS / "nbval-sanitize.cfg").read_text())

    def sanitize(text: str) -> str:
        for regex, replacement in patterns:
            text = re.sub(regex, replacement, text)
        return text

    one = (
        "connected to http://127.0.0.1:41407 (backend 0.1.0) via your local backend in /tmp/cortex-a/local\n"
        "job-1a2b3c4d5e6f req-0123456789abcdef run-4b1f0c2a9e77 at 2026-11-29 09:31:34.587175+00:00 in 0:16, 71 ms"
        " <object at 0x7f00deadbeef>"
    )
    two = (
        "connected to http://127.0.0.1:8765 (backend 0.2.0rc1) via your local backend in /home/u/.local/x\n"
        "job-ffffffffffff req-fedcba9876543210 run-000000000000 at 2027-01-02 03:04:05+00:00 in 12:03, 1.5 s"
        " <object at 0x55aa55aa55aa>"
    )
    assert sanitize(one) == sanitize(two)
    kept = "100 problems, 19 distinct sums; exact match 55%; step-200; failed output_missing"
    assert sanitize(kept) == kept  # what a notebook checks is left alone


def _nbval(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest --nbval-lax on `folder`, with this repository's notebook conftest and sanitizer."""
    shutil.copy(NOTEBOOKS / "conftest.py", folder / "conftest.py")
    shutil.copy(NOTEBOOKS / "nbval-sanitize.cfg", folder / "nbval-sanitize.cfg")
    env = {key: value for key, value in os.environ.items() if not key.startswith("CORTEX_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--nbval-lax",
            "--nbval-current-env",
            "-q",
            "-rA",
            "--rootdir",
            str(folder),
            "-c",
            os.devnull,
            *args,
            str(folder),
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _write(path: Path, cells: list[tuple[str, list]]) -> None:
    """Code cells with reference outputs (a non-empty list marks the cell as run)."""
    notebook = nbformat.v4.new_notebook()
    for count, (source, outputs) in enumerate(cells, 1):
        cell = nbformat.v4.new_code_cell(source, outputs=outputs, execution_count=count if outputs else None)
        notebook.cells.append(cell)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)


def test_nbval_gives_kernels_the_promised_environment_and_compares_after_sanitizing(tmp_path):
    stream = nbformat.v4.new_output(
        "stream",
        name="stdout",
        text="connected to http://127.0.0.1:1 (backend 9.9.9) via your local backend in /x\n",
    )
    _write(
        tmp_path / "environment.ipynb",
        [
            (
                "import os, tempfile\n"
                "assert os.environ['CORTEX_NONINTERACTIVE'] == '1'\n"
                "local = os.environ['CORTEX_LOCAL_DIR']\n"
                "assert local.startswith(tempfile.gettempdir()) and not local.startswith(os.path.expanduser('~'))",
                [],
            ),
            (
                "# NBVAL_CHECK_OUTPUT\n"
                "print('connected to http://127.0.0.1:43975 (backend 0.1.0) via your local backend in /tmp/abc/local')",
                [stream],
            ),
        ],
    )
    # Collected after the notebook: the variables were set only around its kernel's start.
    (tmp_path / "test_zz_after.py").write_text(
        "import os\n\ndef test_the_variables_are_restored():\n"
        "    assert 'CORTEX_NONINTERACTIVE' not in os.environ and 'CORTEX_LOCAL_DIR' not in os.environ\n"
    )
    result = _nbval(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "3 passed" in result.stdout


def test_a_broken_api_or_a_changed_checked_output_fails_the_nbval_run(tmp_path):
    """What CI relies on: a notebook that calls an API that is gone, or whose checked output changed, fails."""
    stream = nbformat.v4.new_output("stream", name="stdout", text="19\n")
    _write(
        tmp_path / "api.ipynb",
        [
            ("from cortex_nb.demo_data import addition_problems", []),
            (
                "addition_problems().answers()",
                [],
            ),  # no such method: as if an API the notebook uses was renamed
        ],
    )
    _write(
        tmp_path / "output.ipynb",
        [
            (
                "# NBVAL_CHECK_OUTPUT\nprint(len({row['completion'] for row in __import__('cortex_nb.demo_data').demo_data"
                ".addition_problems(max_operand=8)}))",
                [stream],
            ),  # 17 distinct sums now, the reference says 19
        ],
    )
    result = _nbval(tmp_path)
    assert result.returncode == 1, result.stdout[-3000:]
    assert re.search(r"FAILED .*api\.ipynb::Cell 1", result.stdout)
    assert "AttributeError" in result.stdout
    assert re.search(r"FAILED .*output\.ipynb::Cell 0", result.stdout)
    assert "1 passed" in result.stdout  # the import cell
