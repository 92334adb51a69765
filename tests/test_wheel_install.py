"""The wheel from `python -m build` carries the prebuilt panel and the server extension's config: in a
fresh venv with no Node.js on PATH, JupyterLab lists the panel as enabled and OK, and the server
extension as enabled.

For speed the fresh venv borrows its dependencies (JupyterLab, ...) from the test environment's
site-packages through a .pth line, and the wheel is installed with --no-deps: what is checked is what
the wheel itself brings.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from cortex_nb.protocol.versions import __version__

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the build hook finds the labextension already built (it rebuilds only when a
    # source file is newer), so this needs neither the network nor a Node.js build here.
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("cortex_nb-*.whl")
    return built


def test_wheel_ships_the_prebuilt_panel_and_server_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = f"cortex_nb-{__version__}.data/data"
    assert f"{data}/share/jupyter/labextensions/cortex-nb/package.json" in names
    assert f"{data}/share/jupyter/labextensions/cortex-nb/install.json" in names
    assert f"{data}/share/jupyter/labextensions/cortex-nb/static/style.js" in names
    assert any(
        re.fullmatch(rf"{data}/share/jupyter/labextensions/cortex-nb/static/remoteEntry\.\w+\.js", n)
        for n in names
    )
    assert f"{data}/etc/jupyter/jupyter_server_config.d/cortex_server.json" in names
    assert "cortex_server/__init__.py" in names and "cortex_nb/jupyter_proxy.py" in names


def venv_with_the_wheel(wheel: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A fresh venv holding only the wheel; its dependencies are borrowed from the test environment
    through a .pth file, so nothing is downloaded. Returns the venv, its python and its site-packages."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
    )
    return venv, python, site


def test_wheel_installs_and_lists_ok_without_node(wheel, tmp_path):
    venv, python, site = venv_with_the_wheel(wheel, tmp_path)

    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("JUPYTER", "CORTEX", "VIRTUAL_ENV"))
    }
    env.update(
        {
            "PATH": str(venv / "bin"),
            "HOME": str(tmp_path / "home"),
            "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
            "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        }
    )
    assert shutil.which("node", path=env["PATH"]) is None and shutil.which("npm", path=env["PATH"]) is None

    # `jupyter labextension list` and `jupyter server extension list`, by their entry points.
    labextensions = subprocess.run(
        [str(python), "-m", "jupyterlab.labextensions", "list"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    listing = ANSI.sub("", labextensions.stdout + labextensions.stderr)
    assert re.search(
        rf"{re.escape(str(venv))}/share/jupyter/labextensions\n(?:.*\n)*?\s+cortex-nb v{re.escape(__version__)} enabled OK"
        r" \(python, cortex-nb\)",
        listing,
    ), listing
    server = subprocess.run(
        [str(python), "-m", "jupyter_server.extension.serverextension", "list"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    listing = ANSI.sub("", server.stdout + server.stderr)
    assert re.search(rf"{re.escape(str(venv))}/etc/jupyter\n(?:.*\n)*?\s+cortex_server enabled", listing), (
        listing
    )
    assert re.search(rf"cortex_server {re.escape(__version__)} OK", listing), listing
    # The installed package is the wheel's, not the source tree's.
    where = subprocess.run(
        [str(python), "-c", "import cortex_server; print(cortex_server.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(site))


def test_demo_notebook_runs_the_quickstart_shipped_in_the_wheel(wheel, tmp_path):
    """`cortex-nb demo --notebook` from an installed wheel, away from any checkout: the quickstart it runs
    is the copy inside the package, byte for byte the repository's notebooks/01-quickstart.ipynb."""
    shipped = zipfile.ZipFile(wheel).read("cortex_nb/notebooks/01-quickstart.ipynb")
    assert shipped == (ROOT / "notebooks" / "01-quickstart.ipynb").read_bytes()

    venv, python, site = venv_with_the_wheel(wheel, tmp_path)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("JUPYTER", "CORTEX", "VIRTUAL_ENV"))
    }
    env.update(
        {
            "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
            "HOME": str(tmp_path / "home"),
            "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
            "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        }
    )
    where = subprocess.run(
        [str(python), "-c", "from cortex_nb.demo import quickstart_notebook; print(quickstart_notebook())"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where == str(site / "cortex_nb" / "notebooks" / "01-quickstart.ipynb")

    result = subprocess.run(
        [str(venv / "bin" / "cortex-nb"), "demo", "--notebook", "--data-dir", str(tmp_path / "backend")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    executed = tmp_path / "cortex-nb-quickstart.ipynb"  # the default: the current folder
    assert f"wrote the executed notebook to {executed}" in result.stdout
    assert re.search(r"exact match on all 100 problems: \d+%", result.stdout)
    assert '"output_type": "error"' not in executed.read_text()
