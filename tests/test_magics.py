"""%cortex / %%cortex in a real IPython shell against the real backend on loopback."""

from __future__ import annotations

import json
import re
import signal
import threading
from collections import OrderedDict

import pandas as pd
import pytest

from cortex_nb import Client, TrainingJob
from cortex_nb.magics import SUBCOMMANDS, CortexMagics
from cortex_nb.protocol.states import format_loss
from cortex_nb.widgets import job_widget

from .notebook_fixtures import DEMO_TEXT, run_cell, train_spec, wait_until


def widget_state(job_id: str):
    return job_widget._WIDGETS[job_id].state


def train_20_steps(shell, backend):
    """A finished 20-step training run of `tiny` on the shipped text, kept alive for sampling."""
    ran = run_cell(shell, "%%cortex train --wait --name magic-test\n" + train_spec(20, keep_alive="10m"))
    assert ran.success, ran.stderr
    job = ran.result
    yield job
    with Client(backend.url, backend.token) as client:
        client.cancel_job(job.job_id)


@pytest.fixture(scope="module")
def trained_job(cortex_shell, backend):
    """Shared by the tests that only read from the job."""
    yield from train_20_steps(cortex_shell, backend)


@pytest.fixture
def own_trained_job(cortex_shell, backend):
    """For tests that cancel the job."""
    yield from train_20_steps(cortex_shell, backend)


def magics_instance(shell) -> CortexMagics:
    return shell.magics_manager.registry["CortexMagics"]


# connect ------------------------------------------------------------------------------------------
def test_connect_follows_env_then_default_profile_then_prints_how(
    cortex_shell, backend, tmp_path, monkeypatch
):
    magics = magics_instance(cortex_shell)
    previous = magics.connection
    try:
        monkeypatch.setenv("CORTEX_URL", backend.url)
        monkeypatch.setenv("CORTEX_TOKEN", backend.token)
        ran = run_cell(cortex_shell, "%cortex connect")
        assert ran.success, ran.stderr
        assert "via environment (CORTEX_URL)" in ran.stdout
        assert magics.connection.client.url == backend.url

        monkeypatch.delenv("CORTEX_URL")
        monkeypatch.delenv("CORTEX_TOKEN")
        config = tmp_path / "config.toml"
        config.write_text(
            f'default = "lab"\n[profiles.lab]\nurl = "{backend.url}"\ntoken_env = "LAB_TOKEN"\n'
        )
        monkeypatch.setenv("CORTEX_CONFIG", str(config))
        monkeypatch.setenv("LAB_TOKEN", backend.token)
        ran = run_cell(cortex_shell, "%cortex connect")
        assert ran.success, ran.stderr
        assert "via profile 'lab'" in ran.stdout
        assert magics.connection.client.whoami()["owner"] == "admin"

        monkeypatch.setenv("CORTEX_CONFIG", str(tmp_path / "absent.toml"))
        monkeypatch.setenv(
            "JUPYTER_RUNTIME_DIR", str(tmp_path / "no-jupyter-here")
        )  # no server to go through
        connected_before = magics.connection
        ran = run_cell(cortex_shell, "%cortex connect")
        assert ran.success
        assert "no cortex backend is configured" in ran.stdout and "%cortex connect --local" in ran.stdout
        assert magics.connection is connected_before

        ran = run_cell(cortex_shell, "%cortex connect nosuch")
        assert not ran.success
        assert len(ran.error_lines) == 1 and "no profile 'nosuch'" in ran.error_lines[0]
    finally:
        magics.connection = previous


def test_connect_to_url_reads_token_from_named_variable(cortex_shell, backend, monkeypatch):
    magics = magics_instance(cortex_shell)
    previous = magics.connection
    try:
        monkeypatch.setenv("MY_CORTEX_TOKEN", backend.token)
        ran = run_cell(cortex_shell, f"%cortex connect {backend.url} --token-env MY_CORTEX_TOKEN")
        assert ran.success, ran.stderr
        assert magics.connection.client.whoami()["scopes"] == ["admin"]
        ran = run_cell(cortex_shell, f"%cortex connect {backend.url} --token-env UNSET_VARIABLE_X")
        assert not ran.success and "$UNSET_VARIABLE_X is not set" in ran.error_lines[0]
    finally:
        magics.connection = previous


# train ----------------------------------------------------------------------------------------------
def test_train_20_steps_returns_job_and_widget_shows_falling_loss(cortex_shell, trained_job, backend):
    assert isinstance(trained_job, TrainingJob)
    assert cortex_shell.user_ns["_"] is trained_job
    widget = job_widget._WIDGETS[trained_job.job_id]
    widget.throttle.flush()
    snap = widget.state.snapshot()
    # Trained on the backend, which keeps the job up for sampling (keep_alive): one word says so.
    assert snap.status == "sampling" and snap.step == 20 and snap.total_steps == 20
    assert [step for step, _ in snap.loss] == list(range(1, 21))
    first, last = snap.loss[0][1], snap.loss[-1][1]
    assert last < first * 0.9, (first, last)
    assert widget.progress.value == 20 and widget.progress.max == 20
    assert ">sampling<" in widget.header.value and "tiny" in widget.header.value
    assert "<polyline" in widget.loss_chart.value
    assert (
        repr(widget)
        == f"<cortex job {trained_job.job_id} sampling step 20/20 loss per token {format_loss(snap.last_loss)}>"
    )
    with Client(backend.url, backend.token) as client:
        job = client.get_job(trained_job.job_id)
    assert (
        job["status"] == "running"
        and job["name"] == "magic-test"
        and job["progress"]["phase"] == "keep_alive"
    )
    assert job["keep_alive_until"] > job["last_activity_at"] and job["progress"]["last_checkpoint"] == "final"
    assert job["progress"]["loss_per_token"] == pytest.approx(last)


def test_widget_device_chart_shows_cpu_and_ram_from_the_backend_monitor(trained_job):
    """This host has no NVIDIA GPU: the backend's samples carry CPU/RAM only, and so does the chart."""
    state = widget_state(trained_job.job_id)
    job_widget._WIDGETS[trained_job.job_id].feed.start()
    wait_until(lambda: len(state.snapshot().metrics.get("job_cpu_percent", [])) >= 2, 60)
    snap = state.snapshot()
    assert snap.metric_kind == "cpu" and snap.metrics_device == snap.devices[0]
    # The host's CPU/RAM and the job's own worker's; no GPU series, not even zeros.
    assert set(snap.metrics) == {"cpu_percent", "ram_percent", "job_cpu_percent", "job_ram_percent"}
    assert snap.metrics_note == "CPU host: no GPU metrics"
    assert all(0 <= value <= 100 for _, value in snap.metrics["ram_percent"])
    widget = job_widget._WIDGETS[trained_job.job_id]
    widget.throttle.mark_dirty()
    widget.throttle.flush()
    wait_until(lambda: "<polyline" in widget.device_chart.value, 10)
    assert f"CPU / RAM, % of host · {snap.metrics_device}" in widget.device_chart.value
    assert ">job CPU<" in widget.device_chart.value and ">host CPU<" in widget.device_chart.value
    assert (
        widget.device_note.value.count("GPU") == 1 and "CPU host: no GPU metrics" in widget.device_note.value
    )


def test_train_without_wait_leaves_the_notebook_free(cortex_shell, backend):
    ran = run_cell(cortex_shell, "%%cortex train -o bg_job\n" + train_spec(2000))
    assert ran.success, ran.stderr
    job = cortex_shell.user_ns["bg_job"]
    state = widget_state(job.job_id)
    try:
        # The cell returned while the backend trains; other cells run meanwhile.
        other = run_cell(cortex_shell, "21 * 2")
        assert other.result == 42
        wait_until(lambda: state.step >= 2, 120)
        assert state.status == "training" and not state.finished
    finally:
        run_cell(cortex_shell, f"%cortex cancel {job.job_id}")
    wait_until(lambda: state.finished, 60)
    assert state.status == "cancelled" and state.step < 2000
    assert not job.client.list_checkpoints(job.job_id)  # cancel stops now and saves nothing


def test_train_with_eval_and_samples_from_a_dataframe_variable(cortex_shell, backend):
    text = DEMO_TEXT.read_text()
    cortex_shell.user_ns["pairs"] = pd.DataFrame(
        [
            {"prompt": "Q: what did the keeper write? A:", "completion": " " + line}
            for line in text.splitlines()
        ]
        * 4
    )
    body = (
        "base_model: tiny\ndata: $pairs\nsteps: 12\nbatch_size: 2\nmax_seq_len: 48\noptimizer: {lr: 0.003}\n"
        f"eval: {{every: 5, data: {DEMO_TEXT}}}\n"
        "sample: {every: 6, prompts: ['Q: what did the keeper write? A:'], max_tokens: 8}\n"
    )
    ran = run_cell(cortex_shell, "%%cortex train --wait -o qa_job\n" + body)
    assert ran.success, ran.stderr
    job = cortex_shell.user_ns["qa_job"]
    snap = widget_state(job.job_id).snapshot()
    assert snap.status == "done"  # no keep_alive: the job completed when training ended, freeing its device
    assert [step for step, _ in snap.eval_loss] == [5, 10, 12]  # every 5, and at the end
    assert snap.samples_step == 12 and snap.samples[0][0] == "Q: what did the keeper write? A:"
    assert len(snap.samples[0][1]) > 0
    assert "eval loss per token" in ran.stdout
    assert list(job.history["step"]) == list(range(1, 13))
    assert job.history["eval_loss_per_token"].notna().sum() == 3


def test_noninteractive_train_blocks_and_prints_progress_and_summary(cortex_shell, monkeypatch):
    monkeypatch.setenv("CORTEX_NONINTERACTIVE", "1")
    ran = run_cell(cortex_shell, "%%cortex train -o ci_job\n" + train_spec(10))
    assert ran.success, ran.stderr
    job = cortex_shell.user_ns["ci_job"]
    lines = ran.stdout.strip().splitlines()
    assert lines[0] == f"{job.job_id}: training tiny on the backend: 10 steps of 4 x 64 tokens"
    progress = [line for line in lines if line.startswith(f"{job.job_id} step ")]
    steps = [int(line.split()[2].split("/")[0]) for line in progress]
    assert steps == sorted(set(steps)) and 1 <= len(steps) <= 10  # compact: at most one line per tenth
    assert progress[-1].startswith(f"{job.job_id} step 10/10  loss per token ")
    assert lines[-1].startswith(f"{job.job_id} (tiny) done: 10/10 steps")
    assert job.job_id not in job_widget._WIDGETS  # no widget in non-interactive mode
    assert job.refresh()["status"] == "done"


def test_ctrl_c_in_blocking_train_stops_watching_and_the_run_goes_on(cortex_shell, backend):
    stop_watching = threading.Event()
    seen = set(job_widget._WIDGETS)

    main_thread = threading.main_thread().ident

    def press_ctrl_c_once_training() -> None:
        while not stop_watching.wait(0.05):
            fresh = [w for job_id, w in list(job_widget._WIDGETS.items()) if job_id not in seen]
            if fresh and fresh[0].state.step >= 3:
                # To the main thread, as a kernel's interrupt reaches the cell: a signal the kernel hands to
                # another thread waits until the main thread's blocking read returns by itself.
                signal.pthread_kill(main_thread, signal.SIGINT)
                return

    watcher = threading.Thread(target=press_ctrl_c_once_training, daemon=True)
    # Python's own Ctrl-C (KeyboardInterrupt), whatever a library imported by an earlier test left installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    watcher.start()
    try:
        ran = run_cell(cortex_shell, "%%cortex train --wait -o interrupted_job\n" + train_spec(2000))
    finally:
        stop_watching.set()
        signal.signal(signal.SIGINT, previous)
    assert ran.success, ran.stderr
    job = cortex_shell.user_ns["interrupted_job"]
    try:
        note = ran.stdout.strip().splitlines()[-1]
        assert note.startswith(f"stopped watching {job.job_id} at step ")
        assert f"%cortex job {job.job_id} shows it, %cortex cancel {job.job_id} stops it" in note
        step = int(note.split(" at step ")[1].split("/")[0])
        wait_until(lambda: job.progress["step"] > step + 2, 120)  # training goes on without the cell
        assert job.info["status"] == "running"
    finally:
        job.cancel()


# sample -----------------------------------------------------------------------------------------------
def test_sample_from_a_trained_job_returns_a_dataframe(cortex_shell, trained_job):
    ran = run_cell(
        cortex_shell,
        f"%%cortex sample --job {trained_job.job_id} --temperature 0 --max-tokens 12\n"
        "The lighthouse keeper\nOn stormy nights\n",
    )
    assert ran.success, ran.stderr
    frame = ran.result
    assert isinstance(frame, pd.DataFrame)
    assert {"prompt", "sample", "logprob", "finish_reason"} <= set(frame.columns)
    assert list(frame["prompt"]) == ["The lighthouse keeper", "On stormy nights"]
    assert (frame["num_tokens"] <= 12).all() and (frame["logprob"] < 0).all()
    # Greedy from the same weights is the same text again, and matches the SDK's own generate.
    again = run_cell(
        cortex_shell,
        f"%%cortex sample --job {trained_job.job_id} --temperature 0 --max-tokens 12 -o again\n"
        "- The lighthouse keeper\n- On stormy nights\n",
    )
    assert again.success and again.result is None
    assert list(cortex_shell.user_ns["again"]["sample"]) == list(frame["sample"])
    direct = trained_job.generate(["The lighthouse keeper"], temperature=0.0, max_tokens=12).result()
    assert direct.texts[0] == frame["sample"][0]


def test_sample_from_a_model_uses_a_short_lived_sampler(cortex_shell, backend):
    ran = run_cell(cortex_shell, "%%cortex sample --model tiny --n 3 --seed 5 --max-tokens 6\nhello\n")
    assert ran.success, ran.stderr
    frame = ran.result
    assert len(frame) == 3 and set(frame["sample_index"]) == {0, 1, 2}
    with Client(backend.url, backend.token) as client:
        samplers = [job for job in client.list_jobs(limit=50) if job["name"] == "%%cortex sample"]
    assert samplers and samplers[0]["status"] == "done"  # completed, its device freed
    # `%cortex jobs` leaves the tool's own short-lived jobs out, as the sidebar does; --all lists them.
    sampler_id = samplers[0]["job_id"]
    assert samplers[0]["labels"] == {"purpose": "sample"}
    listed = run_cell(cortex_shell, "%cortex jobs --limit 500")
    assert listed.success, listed.stderr
    assert sampler_id not in set(listed.result["job_id"])
    everything = run_cell(cortex_shell, "%cortex jobs --all --limit 500")
    assert sampler_id in set(everything.result["job_id"])
    assert len(everything.result) > len(listed.result)


# tables, logs, cancel, job ----------------------------------------------------------------------------
def test_jobs_capacity_and_models_come_back_as_dataframes(cortex_shell, trained_job):
    jobs = run_cell(cortex_shell, "%cortex jobs --status running").result
    assert isinstance(jobs, pd.DataFrame) and trained_job.job_id in set(jobs["job_id"])
    row = jobs[jobs["job_id"] == trained_job.job_id].iloc[0]
    # One word per state, the step reached, the final loss per token, duration and the hyperparameters.
    assert row["status"] == "sampling" and row["detail"].startswith("keep-alive, freeing the device in ")
    assert (
        row["step"] == 20
        and row["total_steps"] == 20
        and row["loss_per_token"] == trained_job.progress["loss_per_token"]
    )
    assert row["lr"] == 0.003 and row["lora_r"] == 16 and row["batch_size"] == 4 and row["steps"] == 20
    assert re.fullmatch(r"\d+:\d\d", row["duration"])
    done = run_cell(cortex_shell, "%cortex jobs --status done --limit 5").result
    assert trained_job.job_id not in set(done["job_id"]) and len(done) <= 5
    shown = run_cell(cortex_shell, "%cortex capacity")
    capacity = shown.result
    # How sub-jobs run here, in one line ("hosting: a process per sub-job on CPUs ...").
    assert re.search(r"^hosting: .*(process|adapter host)", shown.stdout, re.M), shown.stdout
    assert isinstance(capacity, pd.DataFrame) and (capacity["kind"] == "cpu").all() and len(capacity) >= 1
    assert (capacity["sampler"] == "transformers").all()  # the engine of each device's sampling sub-jobs
    models = run_cell(cortex_shell, "%cortex models").result
    assert {"tiny", "small-gpt2"} <= set(models["name"])
    status = run_cell(cortex_shell, "%cortex status")
    assert status.success and "token: owner admin" in status.stdout and "jobs: " in status.stdout


def test_logs_prints_the_last_lines(cortex_shell, trained_job):
    ran = run_cell(cortex_shell, f"%cortex logs {trained_job.job_id} -n 5")
    assert ran.success, ran.stderr
    lines = ran.stdout.strip().splitlines()
    assert len(lines) == 5
    assert lines[-2].startswith("[engine] step=20 ")
    assert lines[-1] == "[engine] managed training finished at step 20; saved checkpoint final"


def test_cancel_magic_cancels_the_job_on_the_backend(cortex_shell, backend, own_trained_job):
    job_id = own_trained_job.job_id
    ran = run_cell(cortex_shell, f"%cortex cancel {job_id}")
    assert ran.success and ran.stdout.strip() == f"{job_id}: cancelled"
    with Client(backend.url, backend.token) as client:
        assert client.get_job(job_id)["status"] == "cancelled"
    again = run_cell(cortex_shell, f"%cortex cancel {job_id}")  # idempotent
    assert again.success and again.stdout.strip() == f"{job_id}: cancelled"


def test_job_widget_is_rebuilt_from_the_backend_after_a_restart(cortex_shell, own_trained_job, monkeypatch):
    trained_job = own_trained_job
    live = widget_state(trained_job.job_id).snapshot()
    # A kernel restart loses this kernel's widgets; only the backend remembers.
    monkeypatch.setattr(job_widget, "_WIDGETS", OrderedDict())
    ran = run_cell(cortex_shell, f"%cortex job {trained_job.job_id}")
    assert ran.success, ran.stderr
    widget = job_widget._WIDGETS[trained_job.job_id]
    wait_until(lambda: widget.state.step == 20 and len(widget.state.log_tail) >= 20, 30)
    rebuilt = widget.state.snapshot()
    assert rebuilt.loss == live.loss and rebuilt.total_steps == 20  # the backend's record, not a guess
    assert rebuilt.model == "tiny" and rebuilt.status == "sampling"
    wait_until(lambda: widget.state.metric_kind == "cpu", 30)  # device samples since the job started
    widget.cancel_button.click()
    wait_until(lambda: widget.state.job_status == "cancelled", 30)


# errors: one clear line each -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        # Lines are the cell's: line 1 is the %%cortex line.
        (
            "%%cortex train\nbase_model: tiny\nsteps: 5: 6\n",
            "not valid YAML at line 3, column 9: mapping values",
        ),
        (
            "%%cortex train\nbase_model: tiny\ndata: x.jsonl\nsteps: 5\nlearning_rate: 0.1\n",
            "unknown key learning_rate; allowed: base_model",
        ),
        ("%%cortex train\nbase_model: tiny\ndata: x.jsonl\nsteps: 5\nlearning_rate: 0.1\n", "(line 5)"),
        ("%%cortex train\ndata: x.jsonl\nsteps: 5\nlora: {rank: 8}\n", "unknown key in lora lora.rank"),
        ("%%cortex train\ndata: /no/such/train.jsonl\nsteps: 5\n", "data: no file '/no/such/train.jsonl'"),
        ("%%cortex train\ndata: $not_defined_here\nsteps: 5\n", "data: $not_defined_here is not defined"),
        ("%%cortex train\ndata: x.jsonl\n", "give exactly one of steps"),
        (
            "%%cortex train\ndata: x.jsonl\nsteps: 5\nlora:\n  alpha: 8\n  r: 0\n",
            "lora.r (line 6): must be >= 1, not 0",
        ),
        # Refused by the backend when the job is created, named as the cell writes it, with its line.
        (
            f"%%cortex train\ndata: {DEMO_TEXT}\nsteps: 2\nlora:\n  r: 4\n  target_modules: [q_proj, q_projj]\n",
            "[invalid_field] lora.target_modules (line 6): model tiny has no module 'q_projj'; its modules are named ",
        ),
        ("%cortex job job-doesnotexist", "[job_not_found] no job 'job-doesnotexist'"),
        ("%cortex job job-doesnotexist", "list yours with %cortex jobs"),
        ("%cortex logs job-doesnotexist", "[job_not_found]"),
        ("%cortex cancel job-doesnotexist", "[job_not_found]"),
        ("%cortex jobs --status sleeping", "invalid choice: 'sleeping'"),
        ("%cortex frobnicate", "no subcommand 'frobnicate'"),
        ("%cortex train", "is a cell magic"),
        ("%%cortex sample\nhello\n", "exactly one of --job ID or --model NAME"),
    ],
)
def test_problems_print_one_clear_line(cortex_shell, cell, expected):
    ran = run_cell(cortex_shell, cell)
    assert not ran.success
    assert len(ran.error_lines) == 1, ran.stderr
    assert ran.error_lines[0].startswith("UsageError: cortex")
    assert expected in ran.error_lines[0]
    assert "Traceback" not in ran.stdout + ran.stderr
    assert "/v1/" not in ran.error_lines[0]  # hints name magics, not REST routes


def test_bad_jsonl_row_is_named(cortex_shell, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"txt": "typo"}) + "\n")
    ran = run_cell(cortex_shell, f"%%cortex train\ndata: {data}\nsteps: 2\n")
    assert not ran.success and len(ran.error_lines) == 1
    assert 'line 2 has neither a "text" string nor "prompt" and "completion"' in ran.error_lines[0]


# help ------------------------------------------------------------------------------------------------------
def test_help_documents_every_subcommand_and_the_train_keys(cortex_shell):
    doc = cortex_shell.find_magic("cortex").__doc__
    for name in SUBCOMMANDS:
        assert f"%cortex {name}" in doc, name
    for key in (
        "base_model",
        "lora",
        "optimizer",
        "data",
        "batch_size",
        "max_seq_len",
        "steps",
        "epochs",
        "eval",
        "sample",
        "save",
        "seed",
        "keep_alive",
        "budget",
    ):
        assert f"\n  {key} " in doc, key
    assert {
        "connect",
        "status",
        "capacity",
        "models",
        "jobs",
        "job",
        "logs",
        "cancel",
        "checkpoints",
        "compare",
        "notify",
        "runs",
        "stats",
        "usage",
        "speedtest",
        "train",
        "sample",
        "run",
        "help",
    } == set(SUBCOMMANDS)
    ran = run_cell(cortex_shell, "%cortex help logs")
    assert ran.success and "%cortex logs [-n LINES] [-f] job_id" in ran.stdout


def test_importing_cortex_nb_loads_no_torch_ipython_or_widgets():
    import subprocess
    import sys

    code = (
        "import sys, cortex_nb\n"
        "print(sorted(m for m in ('torch', 'IPython', 'ipywidgets', 'yaml') if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"


def test_noninteractive_job_prints_what_the_backend_knows(cortex_shell, trained_job, monkeypatch):
    monkeypatch.setenv("CORTEX_NONINTERACTIVE", "1")
    live = widget_state(trained_job.job_id).snapshot()
    ran = run_cell(cortex_shell, f"%cortex job {trained_job.job_id}")
    assert ran.success, ran.stderr
    line = ran.stdout.strip()
    assert line.startswith(f"{trained_job.job_id} (tiny) sampling: 20/20 steps")
    assert f"loss per token {format_loss(live.first_loss)} -> {format_loss(live.last_loss)}" in line


def test_error_hints_name_the_magic_that_shows_the_same_thing():
    from cortex_nb.magics.error_text import in_magic_words

    assert in_magic_words("no job 'x' is visible to this token; list yours with GET /v1/jobs") == (
        "no job 'x' is visible to this token; list yours with %cortex jobs"
    )
    assert (
        in_magic_words("list them with GET /v1/jobs/job-1a/checkpoints")
        == "list them with %cortex checkpoints job-1a"
    )
    assert in_magic_words("(GET /v1/capacity shows its devices), (GET /v1/models)") == (
        "(%cortex capacity shows its devices), (%cortex models)"
    )
    # A route with no magic of its own stays as it is; so does one that only starts like a known one.
    assert in_magic_words("see GET /v1/jobs/job-1a/requests") == "see GET /v1/jobs/job-1a/requests"
