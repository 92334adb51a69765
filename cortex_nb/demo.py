"""`cortex-nb demo`: fine-tune the built-in `tiny` model with LoRA on a short text, on a local
backend, and show the loss falling and a greedy sample before and after.
"""

from __future__ import annotations

import math
import os
import signal
import time
from importlib import resources
from pathlib import Path

from .batching import pack_sequences, rows_to_batch
from .client import Client

PROMPT = "The lighthouse keeper"


def demo_text() -> str:
    return resources.files("cortex_nb").joinpath("data/demo.txt").read_text()


def run_demo(
    steps: int = 200, learning_rate: float = 3e-3, data_dir: str | Path | None = None, seq_len: int = 256
) -> dict:
    started = time.monotonic()
    print(
        "cortex-nb demo: LoRA fine-tuning of the built-in 'tiny' model (random weights, byte tokens) on CPU or GPU"
    )
    client = Client.local(data_dir)
    backend = client.local_backend
    print(f"backend: {client.url} (local), devices: {[d['name'] for d in client.get_capacity()['devices']]}")
    text = demo_text()
    with client.create_training_job(
        "tiny", lora={"r": 16, "alpha": 32}, optimizer={"lr": learning_rate}, name="demo"
    ) as job:
        before = job.generate([PROMPT], max_tokens=96, temperature=0.0).result()
        tokens = client.tokenize("tiny", [text])[0]
        batch = rows_to_batch(pack_sequences([tokens], seq_len))
        targets = float(batch["weights"].sum())
        print(
            f"job {job.job_id}: {len(tokens)} tokens in {len(batch['input_ids'])} rows of {seq_len}; {steps} steps at lr {learning_rate}"
        )
        print(f"greedy sample before: {before.texts[0]!r}")
        losses = []
        pending = (job.forward_backward(batch), job.step())
        for step in range(1, steps + 1):
            # Queue the next step before reading this one's result: the worker never waits for us.
            following = (job.forward_backward(batch), job.step()) if step < steps else None
            loss = pending[0].result()["loss"] / targets
            pending[1].result()
            losses.append(loss)
            if step == 1 or step % max(steps // 10, 1) == 0:
                print(f"  step {step:4d}  loss/token {loss:7.4f}  perplexity {math.exp(loss):8.2f}")
            pending = following
        after = job.generate([PROMPT], max_tokens=96, temperature=0.0).result()
        print(f"greedy sample after:  {after.texts[0]!r}")
    # Leaving the block completed the job and waited for it: `final` is saved before the backend stops.
    checkpoints = [row["checkpoint_id"] for row in client.list_checkpoints(job.job_id)]
    print(f"job {job.job_id}: {job.info['status']}, checkpoints {checkpoints}")
    print(f"loss/token {losses[0]:.3f} -> {losses[-1]:.3f} in {time.monotonic() - started:.0f}s")
    client.close()
    if backend.started:  # a one-shot command leaves no backend behind it did not find running
        backend.stop()
    return {
        "losses": losses,
        "before": before.texts[0],
        "after": after.texts[0],
        "job_id": job.job_id,
        "status": job.info["status"],
        "checkpoints": checkpoints,
    }


# The quickstart notebook, run headless (`cortex-nb demo --notebook`) -------------------------------
QUICKSTART = "01-quickstart.ipynb"
DEFAULT_EXECUTED_COPY = "cortex-nb-quickstart.ipynb"


def quickstart_notebook() -> Path:
    """The shipped 01-quickstart: inside the installed package (the wheel carries a copy), else the
    source checkout's notebooks/ folder (an editable install)."""
    shipped = resources.files("cortex_nb").joinpath("notebooks").joinpath(QUICKSTART)
    if shipped.is_file():
        return Path(str(shipped))
    checkout = Path(__file__).resolve().parent.parent / "notebooks" / QUICKSTART
    if checkout.is_file():
        return checkout
    raise FileNotFoundError(f"{QUICKSTART} is neither in the installed package nor in a source checkout")


def run_notebook_demo(dest: str | Path = DEFAULT_EXECUTED_COPY, data_dir: str | Path | None = None) -> Path:
    """Execute 01-quickstart headless, printing what each cell shows, and write the executed copy at
    `dest` (its folder is the kernel's working folder). Raises nbclient's `CellExecutionError` if a
    cell fails; the copy up to that cell is written first."""
    from .headless import cell_text, execute_notebook, read_notebook
    from .local import default_local_dir

    source = quickstart_notebook()
    dest = Path(dest).expanduser().resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    env = {"CORTEX_LOCAL_DIR": str(Path(data_dir).expanduser().resolve())} if data_dir else {}
    backend_dir = Path(env["CORTEX_LOCAL_DIR"]) if data_dir else default_local_dir()
    already_running = _backend_pid(backend_dir)
    notebook = read_notebook(source)
    started = time.monotonic()
    print(
        f"cortex-nb demo: running {source.name} headless (CORTEX_NONINTERACTIVE=1: text progress instead of widgets)",
        flush=True,
    )

    def show(index: int, cell, seconds: float) -> None:
        # The first line that says what the cell does (nbval's markers say nothing to a reader).
        lines = [line for line in cell.source.splitlines() if line.strip() and "NBVAL_" not in line]
        first_line = lines[0] if lines else ""
        print(f"\n[{index}] {first_line}  ({seconds:.1f}s)", flush=True)
        text = cell_text(cell).rstrip()
        if text:
            print(text, flush=True)

    try:
        execute_notebook(notebook, dest.parent, env=env, on_cell=show)
    finally:
        import nbformat

        dest.write_text(nbformat.writes(notebook) + "\n")
        print(
            f"\nwrote the executed notebook to {dest} ({time.monotonic() - started:.0f}s); open it in JupyterLab",
            flush=True,
        )
        started_by_kernel = _backend_pid(backend_dir)
        if started_by_kernel is not None and started_by_kernel != already_running:
            # The notebook's `%cortex connect --local` started the local backend; a one-shot command
            # stops it again, so nothing runs on that nobody asked to keep.
            _stop(started_by_kernel)
    return dest


def _backend_pid(data_dir: Path) -> int | None:
    """The pid of the local backend serving `data_dir`, if one is alive."""
    from .local import running_endpoint

    endpoint = running_endpoint(data_dir / "backend.json")
    return int(endpoint["pid"]) if endpoint else None


def _stop(pid: int, timeout_s: float = 30.0) -> None:
    from .local import wait_for_exit

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    wait_for_exit(pid, timeout_s)
