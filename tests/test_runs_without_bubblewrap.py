"""A backend on a host without bubblewrap has no run sandbox: it refuses source runs with one stable code
and a message that says how to install it, unless its operator starts it with --allow-unsandboxed-runs;
then GET /v1/capacity, `%cortex capacity` and every run report say the runs are unsandboxed. bubblewrap is
hidden from the backend's PATH; everything else is real (backend, runs, client, magics)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cortex_nb import Client
from cortex_nb.errors import CortexError

from .backend_process import start_backend
from .notebook_fixtures import run_cell
from .run_projects import write_project


def path_without_bwrap(folder: Path) -> str:
    """A PATH of links to every program on ours except bwrap."""
    folder.mkdir()
    for directory in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            link = folder / name
            if name != "bwrap" and not link.exists():
                link.symlink_to(os.path.join(directory, name))
    assert shutil.which("bwrap", path=str(folder)) is None
    return str(folder)


@pytest.fixture(scope="module")
def workspace():
    # Without a mount namespace a run's own uid must reach its work dir (as in test_runs_sandbox.py).
    path = tempfile.mkdtemp(prefix="cortex-runs-nobwrap-", dir="/tmp")
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def backend_without_bwrap(tmp_path: Path, workspace: str, *args: str):
    return start_backend(
        tmp_path / "backend",
        "--devices",
        "cpu:2",
        "--warm-workers",
        "0",
        "--runs-workspace",
        workspace,
        *args,
        env={"PATH": path_without_bwrap(tmp_path / "bin")},
    )


def capacity_magic(url: str, token: str) -> str:
    """What `%cortex capacity` prints, from a shell connected to this backend (the previous connection
    is put back afterwards)."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    assert run_cell(shell, "%load_ext cortex_nb").success
    magics = shell.magics_manager.registry["CortexMagics"]
    previous = magics.connection
    os.environ["CORTEX_NOBWRAP_TOKEN"] = token
    try:
        assert run_cell(shell, f"%cortex connect {url} --token-env CORTEX_NOBWRAP_TOKEN").success
        ran = run_cell(shell, "%cortex capacity")
        assert ran.success, ran.stderr
        return ran.stdout
    finally:
        del os.environ["CORTEX_NOBWRAP_TOKEN"]
        magics.connection = previous


def test_without_bubblewrap_source_runs_are_refused_saying_how_to_install_it(tmp_path, workspace):
    backend = backend_without_bwrap(tmp_path, workspace)
    try:
        with Client(backend.url, backend.token) as client:
            spec = write_project(tmp_path / "p", "", name="no-sandbox", command="echo THE-CODE-RAN")
            with pytest.raises(CortexError) as refused:
                client.run(spec)
            assert refused.value.code == "sandbox_unavailable"
            assert "apt-get install bubblewrap" in refused.value.message
            assert "--allow-unsandboxed-runs" in refused.value.message
            assert len(client.list_runs()) == 0  # nothing was made, nothing ran
            source_runs = client.get_capacity()["source_runs"]
            assert source_runs["sandbox"] == "none" and source_runs["runs_accepted"] is False
        printed = capacity_magic(backend.url, backend.token)
        assert "source runs: this backend has no run sandbox" in printed
    finally:
        backend.stop()


def test_allow_unsandboxed_runs_runs_them_and_every_view_says_unsandboxed(tmp_path, workspace):
    backend = backend_without_bwrap(tmp_path, workspace, "--allow-unsandboxed-runs")
    try:
        with Client(backend.url, backend.token) as client:
            source_runs = client.get_capacity()["source_runs"]
            assert source_runs["runs_accepted"] is True and source_runs["note"].startswith("UNSANDBOXED")
            handle = client.run(
                write_project(tmp_path / "p", "", name="allowed", command="echo THE-CODE-RAN")
            )
            assert handle.wait(60)["status"] == "done"
            assert "THE-CODE-RAN" in handle.logs()
            report = handle.report()
            assert report["isolation"]["sandbox"].startswith(
                "none (unsandboxed runs allowed by the operator)"
            )
            assert report["isolation"]["filesystem"] == "none"
        printed = capacity_magic(backend.url, backend.token)
        assert "source runs: UNSANDBOXED" in printed
    finally:
        backend.stop()


def test_doctor_says_what_the_host_gives_and_that_runs_would_be_refused(tmp_path):
    doctor = [sys.executable, "-m", "cortex_nb.cli", "doctor"]
    env = {**os.environ, "PATH": path_without_bwrap(tmp_path / "bin")}
    hidden = subprocess.run(doctor, env=env, capture_output=True, text=True, timeout=120)
    assert hidden.returncode == 0, hidden.stderr
    rows = {line[:16].strip(): line[16:].strip() for line in hidden.stdout.splitlines()}
    assert set(rows) == {"bubblewrap", "user namespaces", "cgroups", "GPUs", "running as", "source runs"}
    assert rows["bubblewrap"].startswith("NO: bubblewrap (bwrap) is not installed")
    assert rows["source runs"].startswith("REFUSED: ") and "apt-get install bubblewrap" in rows["source runs"]
    if shutil.which("bwrap") is not None:
        present = subprocess.run(doctor, capture_output=True, text=True, timeout=120)
        assert "accepted, each in a bubblewrap sandbox" in present.stdout
