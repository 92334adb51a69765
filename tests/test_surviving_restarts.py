"""Work survives the backend: SIGTERM drains (training runs pause at a resumable checkpoint, new work is
refused with a retryable code), the next start resumes every training run from its newest resumable
checkpoint, and clients ride through the restart. Real backend processes on one data dir and port."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from cortex_nb import Client, ConflictError, RequestFailed
from cortex_nb.batching import rows_to_batch
from cortex_nb.demo_data import addition_problems
from cortex_nb.train_data import Example, tokenize_and_pack

from .backend_process import BackendProcess, start_backend
from .notebook_fixtures import wait_until

SPEC = {
    "base_model": "tiny",
    "batch_size": 8,
    "max_seq_len": 16,
    "optimizer": {"lr": 0.003},
    "lora": {"r": 8, "alpha": 16},
    "seed": 3,
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def backend_on(data_dir: Path, port: int, *args: str) -> BackendProcess:
    """A backend on a fixed port, so a client made before a restart reaches the next one."""
    return start_backend(data_dir, "--devices", "cpu:4", "--port", str(port), *args)


class Waiter(threading.Thread):
    """`job.wait()` on a thread, keeping what it returned or raised."""

    def __init__(self, job) -> None:
        super().__init__(daemon=True)
        self.job = job
        self.outcome = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.outcome = self.job.wait(timeout_s=900)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def curve(job: dict) -> list[tuple[int, float]]:
    return [(point["step"], point["loss_per_token"]) for point in job["progress"]["history"]]


def past_a_checkpoint(job) -> bool:
    """Steps past a periodic checkpoint (every 5) are seen, so a kill now loses some."""
    progress = job.progress or {}
    saved = progress.get("last_checkpoint_step") or 0
    return saved >= 5 and progress.get("step", 0) >= saved + 2


def completed_in_full(waiter: Waiter, steps: int) -> dict:
    """The run the waiter followed through a restart ended done, all its steps, its curve continuous: its
    progress record."""
    waiter.join(900)
    assert waiter.error is None, waiter.error
    finished = waiter.outcome
    assert finished["status"] == "done", finished
    progress = finished["progress"]
    assert progress["step"] == progress["total_steps"] == steps
    assert [step for step, _ in curve(finished)] == list(range(1, steps + 1))
    return progress


def all_logs(client: Client, job_id: str) -> str:
    return "\n".join(line["line"] for line in client.stream_logs(job_id, follow=False))


def test_sigterm_drains_a_run_and_the_next_start_resumes_it_losing_no_step(tmp_path):
    data_dir, port = tmp_path / "data", free_port()
    steps = 120
    first = backend_on(data_dir, port)
    client = Client(first.url, first.token, reconnect_s=300)
    second = None
    try:
        job = client.train({**SPEC, "data": addition_problems(), "steps": steps}, name="survivor")
        primitive = client.create_training_job("tiny")
        primitive.save("mine", "weights-only").result()
        wait_until(lambda: (job.progress or {}).get("step", 0) >= 3, 180)
        waiter = Waiter(job)  # rides through the restart
        waiter.start()
        followed: list[str] = []
        follower = threading.Thread(
            target=lambda: followed.extend(line["line"] for line in client.stream_logs(job.job_id)),
            daemon=True,
        )
        follower.start()

        # A primitive job's queued request runs to its end while the backend drains: a long one holds the
        # drain open while the new work below is refused (else a quick drain could exit before it is sent).
        held = client.generate(primitive.job_id, ["12+34="], {"max_tokens": 300, "temperature": 0.0})
        wait_until(lambda: client.get_request_status(primitive.job_id, held)["status"] == "running", 60)
        started, signalled_at = time.monotonic(), time.time()
        first.process.send_signal(signal.SIGTERM)
        # While it drains, new work is refused with a retryable code (the client would retry it).
        refused = httpx.post(
            f"{first.url}/v1/jobs",
            json={"sub_jobs": [{"type": "training", "base_model": "tiny"}]},
            headers={"Authorization": f"Bearer {first.token}"},
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "backend_draining"
        first.process.wait(120)
        assert first.process.returncode == 0
        drain_s = time.monotonic() - started
        assert "drained in" in first.log()
        assert "Traceback" not in first.log() and "BrokenPipeError" not in first.log()

        second = backend_on(data_dir, port)
        waiter.join(900)
        assert waiter.error is None, waiter.error
        finished = waiter.outcome
        assert finished["status"] == "done", finished
        progress = finished["progress"]
        assert progress["step"] == progress["total_steps"] == steps
        assert [step for step, _ in curve(finished)] == list(range(1, steps + 1))
        resumed = progress["resumed"]
        assert resumed["lost_steps"] == 0 and resumed["restarts"] == 1
        # The record's clock is the run's, not the second backend's: it started before the SIGTERM.
        assert progress["started_at"] is not None and progress["started_at"] < signalled_at
        assert progress["elapsed_s"] > signalled_at - progress["started_at"]
        assert resumed["checkpoint_id"].startswith("drained-step-") and 3 <= resumed["step"] < steps
        checkpoints = {c["checkpoint_id"]: c for c in client.list_checkpoints(job.job_id)}
        assert checkpoints[resumed["checkpoint_id"]]["type"] == "resumable"
        logs = all_logs(client, job.job_id)
        assert f"paused at step {resumed['step']}" in logs
        assert (
            f"resumes from checkpoint {resumed['checkpoint_id']} (step {resumed['step']}); no step was lost"
            in logs
        )
        assert "Traceback" not in logs and "BrokenPipeError" not in logs

        # The curve is the one an uninterrupted run of the same spec draws: nothing skipped or repeated.
        reference = client.train({**SPEC, "data": addition_problems(), "steps": steps}, name="reference")
        expected = reference.wait(timeout_s=600)
        assert [loss for _, loss in curve(finished)] == pytest.approx(
            [loss for _, loss in curve(expected)], rel=1e-5, abs=1e-6
        )

        # The log stream rode through the restart too, and ended with the job.
        follower.join(120)
        assert not follower.is_alive()
        assert any("resumes from checkpoint drained-step-" in line for line in followed)
        assert any(line.startswith("[engine] managed training finished at step") for line in followed)

        # A client-driven job's queued request ran to its end, then it saved a checkpoint and came back
        # holding it (tests/test_client_jobs_survive_restarts.py checks its weights).
        assert client.get_request_status(primitive.job_id, held)["status"] == "succeeded"  # ran to its end
        back = client.get_job(primitive.job_id)
        assert back["status"] in ("pending", "starting", "running")
        assert back["progress"]["resumed"]["checkpoint_id"] == "drained"
        print(f"\nSIGTERM to exit with 1 running run: {drain_s:.2f}s; steps lost: {resumed['lost_steps']}")
    finally:
        client.close()
        for backend in (first, second):
            if backend is not None:
                backend.stop()


def test_kill_9_resumes_from_the_last_periodic_checkpoint_stating_the_lost_steps(tmp_path, cortex_shell):
    from cortex_nb.widgets import job_widget

    data_dir, port = tmp_path / "data", free_port()
    first = backend_on(data_dir, port)
    client = Client(first.url, first.token, reconnect_s=300)
    second = None
    try:
        job = client.train(
            {**SPEC, "data": addition_problems(), "steps": 60, "save": {"every": 5}}, name="crashed"
        )

        waiter = Waiter(job)
        waiter.start()
        widget = job_widget.show_job(client, job.job_id)
        wait_until(lambda: widget.state.job_status == "running", 60)
        # Killed as soon as steps past a checkpoint are seen (the widget is up already), so that the next
        # checkpoint has not been written yet.
        wait_until(lambda: past_a_checkpoint(job), 240, 0.05)
        first.kill()  # no drain: as after a crash or power cut
        wait_until(lambda: "backend restarting, reconnecting" in (widget.state.message or ""), 120)
        assert widget.state.backend_gone
        second = backend_on(data_dir, port)
        # Then the widget follows the resumed run, saying where it resumed and what was lost.
        wait_until(
            lambda: "the backend restarted: resumed from checkpoint step-" in (widget.state.message or ""),
            180,
        )
        assert not widget.state.backend_gone and "step(s) lost, trained again" in widget.state.message
        waiter.join(900)
        assert waiter.error is None, waiter.error
        finished = waiter.outcome
        assert finished["status"] == "done"
        progress = finished["progress"]
        assert progress["step"] == 60
        resumed = progress["resumed"]
        assert resumed["checkpoint_id"] == f"step-{resumed['step']}" and resumed["step"] % 5 == 0
        assert resumed["lost_steps"] >= 1
        assert [step for step, _ in curve(finished)] == list(range(1, 61))
        logs = all_logs(client, job.job_id)
        assert (
            f"resumes from checkpoint step-{resumed['step']} (step {resumed['step']});"
            f" {resumed['lost_steps']} step(s) trained after it were lost" in logs
        )
        print(f"\nkill -9: steps lost {resumed['lost_steps']}")
    finally:
        client.close()
        for backend in (first, second):
            if backend is not None:
                backend.stop()


def test_a_run_started_from_a_checkpoint_trains_as_a_load_of_it_does(client: Client):
    rows = addition_problems()
    source = client.train({**SPEC, "data": rows, "steps": 4, "save": {"every": 2}}, name="source")
    source.wait(timeout_s=300)
    [step2] = [c for c in client.list_checkpoints(source.job_id) if c["checkpoint_id"] == "step-2"]
    assert step2["type"] == "resumable"

    started = client.train(
        {
            **SPEC,
            "data": rows,
            "steps": 5,
            "seed": 7,
            "init_from": {"job": source.job_id, "checkpoint": "step-2", "optimizer": True},
        },
        name="from-step-2",
    )
    primitive = client.create_training_job("tiny", lora=SPEC["lora"], optimizer=SPEC["optimizer"], seed=7)
    loaded = primitive.load("step-2", source_job_id=source.job_id).result()
    assert loaded["restored_optimizer"] is True
    data = tokenize_and_pack(
        client, "tiny", [Example(r["prompt"], r["completion"]) for r in rows], SPEC["max_seq_len"]
    )
    batches = data.batches(SPEC["batch_size"], 7)
    losses = []
    for _ in range(5):
        batch = rows_to_batch(next(batches), data.pad_id)
        fb, step = primitive.forward_backward(batch), primitive.step()
        losses.append(fb.result()["loss"] / float(batch["weights"].sum()))
        step.result()
    finished = started.wait(timeout_s=300)
    assert finished["status"] == "done" and finished["progress"]["step"] == 5
    assert [loss for _, loss in curve(finished)] == pytest.approx(losses, rel=1e-6, abs=1e-7)
    primitive.cancel()


def test_a_load_into_a_training_managed_run_is_refused(client: Client):
    rows = addition_problems()
    source = client.train({**SPEC, "data": rows, "steps": 2, "save": {"every": 1}}, name="loadable")
    source.wait(timeout_s=300)
    running = client.train({**SPEC, "data": rows, "steps": 5000}, name="busy")
    try:
        wait_until(lambda: (running.progress or {}).get("step", 0) >= 1, 180)
        with pytest.raises(ConflictError) as refused:
            running.load("step-1", source_job_id=source.job_id)
        assert refused.value.code == "managed_run_busy"
        assert "init_from" in refused.value.message
    finally:
        running.cancel()


def test_init_from_a_checkpoint_that_is_not_visible_is_refused_naming_the_field(client: Client):
    with pytest.raises(Exception) as refused:
        client.train(
            {
                **SPEC,
                "data": addition_problems(),
                "steps": 2,
                "init_from": {"job": "job-000000000000", "checkpoint": "x"},
            }
        )
    assert getattr(refused.value, "code", None) == "checkpoint_not_found"
    assert refused.value.detail["field"] == "training_loop.init_from"


def test_a_cancelled_run_stops_without_a_traceback_in_its_logs(client: Client):
    job = client.train({**SPEC, "data": addition_problems(), "steps": 5000}, name="cancelled")
    wait_until(lambda: (job.progress or {}).get("step", 0) >= 2, 180)
    job.cancel()
    wait_until(lambda: job.refresh()["status"] == "cancelled", 60)
    time.sleep(4)  # the worker's own way out: the step in hand, then its last lines
    logs = all_logs(client, job.job_id)
    assert "Traceback" not in logs and "BrokenPipeError" not in logs, logs[-3000:]


def test_a_periodic_checkpoint_holds_the_adapter_and_optimizer_never_the_base(client: Client, backend):
    from safetensors import safe_open

    job = client.train({**SPEC, "data": addition_problems(), "steps": 3, "save": {"every": 2}})
    job.wait(timeout_s=300)
    directories = list(Path(backend.data_dir, "checkpoints").glob(f"*/{job.job_id}/step-2"))
    assert len(directories) == 1
    files = sorted(path.name for path in directories[0].iterdir())
    assert files == sorted(
        [
            "adapter_config.json",
            "adapter_model.safetensors",
            "manifest.json",
            "optimizer.safetensors",
            "rng_state.safetensors",
            "trainer_state.json",
        ]
    ), files
    with safe_open(directories[0] / "adapter_model.safetensors", "np") as weights:
        assert weights.keys() and all("lora_" in name for name in weights.keys())


def test_futures_of_requests_lost_in_a_restart_raise_a_retryable_error(tmp_path):
    data_dir, port = tmp_path / "data", free_port()
    first = backend_on(data_dir, port)
    client = Client(first.url, first.token, reconnect_s=300)
    second = None
    try:
        job = client.create_training_job("tiny")
        in_flight = job.generate(["x"] * 4, max_tokens=2000, temperature=1.0, ignore_eos=True)
        wait_until(
            lambda: client.get_request_status(job.job_id, in_flight.request_id)["status"] == "running", 60
        )
        first.kill()
        result: dict = {}

        def wait_result() -> None:
            try:
                in_flight.result()
            except RequestFailed as exc:
                result["error"] = exc

        thread = threading.Thread(target=wait_result, daemon=True)
        thread.start()
        time.sleep(4)  # longer than the transport's own retries: the future waits for the backend
        assert thread.is_alive()
        second = backend_on(data_dir, port)
        thread.join(120)
        error = result["error"]
        assert error.code == "backend_restarted" and error.retryable
    finally:
        client.close()
        for backend in (first, second):
            if backend is not None:
                backend.stop()


@pytest.mark.parametrize(
    "extra, message",
    [
        ("resume: sometimes\n", "resume: must be auto or never"),
        ("init_from: {job: job-abc}\n", "init_from.checkpoint: missing"),
        ("init_from: {job: job-abc, checkpoint: step-2, optimizer: maybe}\n", "init_from.optimizer: must be"),
    ],
)
def test_bad_resume_and_init_from_keys_are_refused_naming_them(extra, message):
    from cortex_nb.train_spec import SpecError, parse_train_spec

    with pytest.raises(SpecError) as refused:
        parse_train_spec("data: a.jsonl\nsteps: 2\n" + extra)
    assert message in refused.value.message


def test_init_from_and_resume_travel_in_the_json_form():
    from cortex_nb.train_spec import parse_train_spec, parse_training_loop

    spec = parse_train_spec(
        "data: a.jsonl\nsteps: 2\nresume: never\ninit_from: {job: job-abc, checkpoint: step-2, optimizer: false}\n"
    )
    loop = spec.training_loop("0" * 64)
    assert loop["resume"] == "never"
    assert loop["init_from"] == {"job": "job-abc", "checkpoint": "step-2", "optimizer": False}
    again = parse_training_loop(loop)
    assert again.resume == "never" and again.init_from == spec.init_from


def test_backend_stop_drains_the_backend_of_a_data_dir_and_leaves_others_alone(tmp_path):
    import subprocess
    import sys

    backend = start_backend(tmp_path / "data", "--devices", "cpu:1")
    try:
        other = tmp_path / "other"
        other.mkdir()
        nothing = subprocess.run(
            [sys.executable, "-m", "cortex_backend", "stop", "--data-dir", str(other)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert nothing.returncode == 0 and "no backend is serving" in nothing.stdout
        assert backend.healthy()
        stopped = subprocess.run(
            [sys.executable, "-m", "cortex_backend", "stop", "--data-dir", str(tmp_path / "data")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "drained and stopped" in stopped.stdout
        assert backend.process.wait(10) == 0
        assert "drained in" in backend.log()
    finally:
        backend.stop()
