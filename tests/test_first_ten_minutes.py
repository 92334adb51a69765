"""What a newcomer meets in the first ten minutes beyond the demo: a magic line pasted with its comment,
`%cortex compare` shown once, defaults shown as values, the CLI reaching the local backend by itself,
`%cortex job ID` in a fresh kernel, and one clear line where an extra is missing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cortex_nb import Client
from cortex_nb.magics import without_comment

from .notebook_fixtures import run_cell


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        ("connect --local            # or a profile", "connect --local"),
        ("jobs --limit 3 #newest", "jobs --limit 3"),
        ('compare a b --prompt "issue #3"  # two runs', 'compare a b --prompt "issue #3"'),
        ("compare a b --prompt 'x # y'", "compare a b --prompt 'x # y'"),
        ("logs job#2", "logs job#2"),
    ],
)
def test_a_trailing_comment_is_dropped_and_a_quoted_hash_kept(line, kept):
    assert without_comment(line) == kept


def test_a_line_magic_pasted_with_its_comment_runs(cortex_shell, client):
    job = client.create_training_job("tiny", name="commented", wait=False)
    try:
        ran = run_cell(cortex_shell, "%cortex jobs --limit 5          # the newest five")
        assert ran.success, ran.stderr
        row = ran.result.set_index("job_id").loc[job.job_id]
        # A job created with no LoRA or optimizer settings shows the values the engine uses, not NaN.
        assert row["lora_r"] == 16 and row["lr"] == 1e-4
    finally:
        job.cancel()


def test_compare_is_displayed_once(cortex_shell, client, monkeypatch):
    """The magic shows the comparison and returns nothing, so IPython does not show it a second time."""
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    jobs = [client.create_training_job("tiny", name=f"compared-{i}") for i in range(2)]
    try:
        for job in jobs:
            job.forward_backward(_batch(client)).result()
            job.step().result()
        ids = " ".join(job.job_id for job in jobs)
        ran = run_cell(cortex_shell, f"%cortex compare {ids} --no-samples  # once")
        assert ran.success, ran.stderr
        assert ran.result is None and len(shown) == 1 and type(shown[0]).__name__ == "ComparisonWidget"
        # The output holds the widget view and, next to it, a static picture for when the model is gone.
        bundle = shown[0]._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        picture = bundle["text/html"]
        assert (
            'class="cortex-compare-static"' in picture and '<img src="data:image/svg+xml;base64,' in picture
        )
        assert all(job.job_id in picture for job in jobs) and "None" not in picture
        assert "<td>16</td>" in picture  # the default LoRA rank, not an empty cell
        ran = run_cell(cortex_shell, f"%cortex compare {ids} --no-samples -o kept")
        assert ran.result is None and len(shown) == 2
        assert cortex_shell.user_ns["kept"].table["job_id"].tolist() == [job.job_id for job in jobs]
    finally:
        for job in jobs:
            job.complete(wait=True)


def _batch(client):
    from cortex_nb.batching import next_token_batch

    return next_token_batch(client.tokenize("tiny", ["The lamp is lit, the sea is calm."]))


def _no_backend_configured(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTEX_")}
    env.update(
        CORTEX_LOCAL_DIR=str(tmp_path / "local"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        CORTEX_CONFIG=str(tmp_path / "config" / "none.toml"),
    )
    return env


def test_cli_runs_uses_the_local_backend_when_nothing_is_configured(tmp_path):
    env = _no_backend_configured(tmp_path)
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "cortex_nb.cli", "runs"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert listed.returncode == 0, listed.stderr
        assert "no runs yet" in listed.stdout and "using your local backend" in listed.stderr
        explicit = subprocess.run(
            [sys.executable, "-m", "cortex_nb.cli", "runs", "--local"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert explicit.returncode == 0 and "no runs yet" in explicit.stdout, explicit.stderr
        assert "using your local backend" not in explicit.stderr  # asked for: nothing to explain
    finally:
        _stop_local(tmp_path / "local")


def _stop_local(data_dir) -> None:
    from cortex_nb.local import find_local_backend

    backend = find_local_backend(data_dir)
    if backend is not None:
        backend.stop()


def test_job_in_a_fresh_kernel_connects_to_the_local_backend_holding_it(tmp_path, monkeypatch, capsys):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    from cortex_nb.magics import CortexMagics

    monkeypatch.setenv("CORTEX_LOCAL_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("CORTEX_NONINTERACTIVE", "1")
    fresh = CortexMagics(InteractiveShell.instance())
    with pytest.raises(UsageError, match="not connected"):  # no local backend runs: nothing to find
        fresh.cortex("job job-anything")
    local = Client.local()
    try:
        job = local.create_training_job("tiny", name="elsewhere", wait=False)
        with pytest.raises(UsageError, match="not connected"):  # a job the local backend does not hold
            fresh.cortex("job job-not-there")
        assert fresh.connection is None
        fresh.cortex(f"job {job.job_id}")
        printed = capsys.readouterr().out
        assert "your local backend" in printed and job.job_id in printed
        assert fresh.connection is not None and fresh.connection.local
        job.cancel()
    finally:
        local.local_backend.stop()


def test_demo_notebook_without_the_lab_extra_names_it(monkeypatch, capsys):
    from cortex_nb.cli import main

    monkeypatch.setitem(sys.modules, "nbformat", None)  # as if cortex-nb[lab] were not installed
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--notebook", "unused.ipynb"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "pip install 'cortex-nb[lab]'" in err and "nbformat" in err and "Traceback" not in err


def test_serve_help_names_the_default_port():
    from cortex_nb.cli import build_parser

    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["backend"]
    text = serve._subparsers._group_actions[0].choices["serve"].format_help()
    assert "default 8765" in text


def test_notify_is_off_by_default_and_notes_a_run_that_ends(cortex_shell, client, monkeypatch):
    """`%cortex notify on`: a widget of this kernel adds one note to its cell when its run ends."""
    from cortex_nb.job_state import JobState
    from cortex_nb.magics.registry import NOTIFY
    from cortex_nb.widgets import job_widget

    ran = run_cell(cortex_shell, "%cortex notify")
    assert ran.success and ran.stdout.strip() == "cortex notify: off"
    notes = []
    monkeypatch.setattr(job_widget, "display", lambda obj, **kw: notes.append(obj))
    job = client.create_training_job("tiny", name="noted")
    try:
        ran = run_cell(cortex_shell, "%cortex notify on")
        assert ran.success and ran.stdout.strip() == "cortex notify: on"
        state = JobState(job.job_id)
        state.set_job(job.refresh())
        widget = job_widget.JobWidget(client, state)
        widget.throttle.close()  # no background render: this test calls the widget's step itself
        widget._live_displays.append(type("Shown", (), {"update": lambda self, obj: None})())
        widget._notify(state.snapshot())  # still running: nothing to say
        assert notes == []
        state.set_job(job.cancel())
        widget._notify(state.snapshot())
        widget._notify(state.snapshot())  # said once
        assert len(notes) == 1 and "cortex: noted cancelled" in notes[0].data
    finally:
        NOTIFY["on"] = False
        job.cancel()
