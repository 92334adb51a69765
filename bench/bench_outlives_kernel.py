"""What a job view costs the backend, and how fast a restarted kernel finds its run again.

    python bench/bench_outlives_kernel.py [--seconds S] [--before REV]

1. Requests per second the job widget's feed makes for one running training job, measured by counting
   the HTTP requests its feed thread sends (httpx event hook), on the same backend in the same run:
   - before (the widget of `--before`, default e13118f, the revision before the backend owned progress):
     a `%%cortex train` loop in the kernel with its widget (log long-poll, status, metrics), and a widget
     reattached with `%cortex job ID`, which rebuilt steps and loss by reading every request's result;
   - after (this tree): the widget of a training run, fed from the job's progress record.
   The "before" code runs in a subprocess from a copy of that revision's `cortex_nb` (git archive).
2. Seconds from a kernel restart (Kernel > Restart) to `%cortex job ID` showing the live step of a
   training run in the restarted kernel, with a real ipykernel; and the part after the kernel was ready.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEMO = ROOT / "cortex_nb" / "data" / "demo.txt"
SPEC = {"steps": 100_000, "batch_size": 4, "max_seq_len": 64}


def count_feed_requests(client, seconds: float, start_view) -> dict:
    """Start a view (after a short warm-up) and count what its feed thread sends for `seconds`."""
    sent: list[tuple[float, str]] = []

    def hook(request) -> None:
        if threading.current_thread().name.startswith("cortex-feed-"):
            sent.append((time.monotonic(), request.url.path))

    client.transport._http.event_hooks["request"].append(hook)
    view = start_view()
    time.sleep(3.0)  # past the first round, which reads the backlog once
    begin = len(sent)
    time.sleep(seconds)
    window = sent[begin:]
    view.close()
    paths: dict[str, int] = {}
    for _, path in window:
        key = "/".join("{id}" if part.startswith(("job-", "req-")) else part for part in path.split("/"))
        paths[key] = paths.get(key, 0) + 1
    return {"per_s": len(window) / seconds, "by_route": paths}


def measure_before(url: str, token: str, seconds: float) -> dict:
    """Runs with the old cortex_nb first on sys.path: its kernel loop, its widget, and its reattached widget."""
    import importlib

    from cortex_nb import Client
    from cortex_nb.job_state import JobState
    from cortex_nb.train_data import load_examples, tokenize_and_pack
    from cortex_nb.train_spec import TrainSpec
    from cortex_nb.widgets.job_widget import JobWidget

    TrainingRun = importlib.import_module(
        "cortex_nb.train_loop"
    ).TrainingRun  # the kernel loop of that revision
    client = Client(url, token)
    spec = TrainSpec(data=str(DEMO), **SPEC)
    data = tokenize_and_pack(client, "tiny", load_examples(str(DEMO), {}), spec.max_seq_len)
    job = client.create_training_job(
        "tiny", lora={"r": 16, "alpha": 32}, optimizer={"lr": 3e-3}, name="bench-before"
    )
    run = TrainingRun(job, spec, data).start()
    while run.state.step < 3:
        time.sleep(0.1)
    results = {
        "kernel_loop_widget": count_feed_requests(
            client, seconds, lambda: JobWidget(client, run.state, run).follow()
        )
    }

    def reattached():
        state = JobState(job.job_id)
        state.set_job(client.get_job(job.job_id))
        return JobWidget(client, state, None).follow()

    results["reattached_widget"] = count_feed_requests(client, seconds, reattached)
    start_step = run.state.step
    begin = time.monotonic()
    time.sleep(2.0)
    results["steps_per_s"] = (run.state.step - start_step) / (time.monotonic() - begin)
    run.stop()
    job.cancel()
    return results


def measure_after(url: str, token: str, seconds: float) -> dict:
    from cortex_nb import Client
    from cortex_nb.job_state import JobState
    from cortex_nb.widgets.job_widget import JobWidget

    client = Client(url, token)
    job = client.train(
        {
            "base_model": "tiny",
            "data": str(DEMO),
            "lora": {"r": 16, "alpha": 32},
            "optimizer": {"lr": 3e-3},
            **SPEC,
        },
        name="bench-after",
    )
    while (job.progress or {}).get("step", 0) < 3:
        time.sleep(0.1)

    def widget():
        state = JobState(job.job_id)
        state.set_job(client.get_job(job.job_id))
        return JobWidget(client, state).follow()

    results = {"managed_run_widget": count_feed_requests(client, seconds, widget)}
    first = job.progress
    time.sleep(2.0)
    last = job.progress
    results["steps_per_s"] = (last["step"] - first["step"]) / max(
        last["updated_at"] - first["updated_at"], 1e-9
    )
    job.cancel()
    return results


def old_package(revision: str, into: Path) -> Path:
    """`cortex_nb` as it was at `revision`, unpacked into `into` (first on sys.path for the 'before' run)."""
    archive = subprocess.run(
        ["git", "archive", revision, "cortex_nb"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def reattach_after_restart() -> dict:
    from cortex_nb import Client
    from cortex_nb.local import find_local_backend
    from tests.kernels import Kernel, kernel_env
    from tests.notebook_fixtures import train_spec

    with tempfile.TemporaryDirectory() as scratch:
        local = Path(scratch) / "local"
        kernel = Kernel(kernel_env(local), Path(scratch))
        try:
            kernel.run("%load_ext cortex_nb\n%cortex connect --local")
            kernel.run("%%cortex train -o job\n" + train_spec(100_000))
            job_id = kernel.run("print(job.job_id)").strip()
            backend = find_local_backend(local)
            client = Client(backend.url, backend.token)
            while (client.get_job(job_id)["progress"] or {}).get("step", 0) < 3:
                time.sleep(0.1)
            restarted = time.monotonic()
            kernel.restart()
            ready = time.monotonic()
            shown = kernel.run(
                "%load_ext cortex_nb\n%cortex connect --local\n%cortex job " + job_id + "\n"
                "import time\nfrom cortex_nb.widgets import job_widget\n"
                f"state = job_widget._WIDGETS[{job_id!r}].state\n"
                "while state.step == 0: time.sleep(0.01)\nprint(state.step)"
            )
            done = time.monotonic()
            client.cancel_job(job_id)
        finally:
            kernel.shutdown()
            found = find_local_backend(local)
            if found is not None:
                found.stop()
    return {
        "restart_to_live_step_s": done - restarted,
        "kernel_ready_to_live_step_s": done - ready,
        "live_step": int(shown.split()[-1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each view is measured")
    parser.add_argument("--before", default="e13118f", help="the revision whose widget is the baseline")
    parser.add_argument("--measure", choices=("before", "after"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--old", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        if args.old:
            sys.path.insert(0, args.old)  # that revision's cortex_nb before this tree's
        measure = measure_before if args.measure == "before" else measure_after
        print(json.dumps(measure(args.url, args.token, args.seconds)))
        return

    from tests.backend_process import start_backend

    with tempfile.TemporaryDirectory() as scratch:
        backend = start_backend(Path(scratch) / "backend", "--devices", "cpu:2", "--worker-threads", "1")
        old = old_package(args.before, Path(scratch) / "before")
        results = {}
        try:
            for mode, extra in (("before", ["--old", str(old)]), ("after", [])):
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--measure",
                        mode,
                        "--url",
                        backend.url,
                        "--token",
                        backend.token,
                        "--seconds",
                        str(args.seconds),
                        *extra,
                    ],
                    capture_output=True,
                    text=True,
                    env={**os.environ, "CORTEX_DISABLE_TELEMETRY": "1"},
                    check=False,
                )
                if out.returncode != 0:
                    raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
                results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        finally:
            backend.stop()
    reattach = reattach_after_restart()
    before, after = results["before"], results["after"]
    print(
        f"tiny, {SPEC['batch_size']} x {SPEC['max_seq_len']} tokens a step, CPU; each view measured for {args.seconds:.0f} s"
    )
    print(
        f"before ({args.before}), a kernel loop's widget:   {before['kernel_loop_widget']['per_s']:6.2f} requests/s"
        f"  ({before['steps_per_s']:.1f} steps/s) {before['kernel_loop_widget']['by_route']}"
    )
    print(
        f"before ({args.before}), a reattached widget:       {before['reattached_widget']['per_s']:6.2f} requests/s"
        f"  {before['reattached_widget']['by_route']}"
    )
    print(
        f"after, a training run's widget:                 {after['managed_run_widget']['per_s']:6.2f} requests/s"
        f"  ({after['steps_per_s']:.1f} steps/s) {after['managed_run_widget']['by_route']}"
    )
    for name in ("kernel_loop_widget", "reattached_widget"):
        print(
            f"  {name}: x{before[name]['per_s'] / max(after['managed_run_widget']['per_s'], 1e-9):.1f} fewer requests/s"
        )
    print(
        f"kernel restart -> reattached widget showing the live step: {reattach['restart_to_live_step_s']:.1f} s"
        f" ({reattach['kernel_ready_to_live_step_s']:.1f} s after the kernel was ready; step {reattach['live_step']})"
    )


if __name__ == "__main__":
    main()
