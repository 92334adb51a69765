"""`%%cortex train`: parse the YAML spec, submit it as a training run, and watch it.

The backend runs the loop in the training worker (`Client.train`); this cell only submits and shows a
live widget fed from the job's progress record (or, non-interactive, prints progress lines). The run
goes on whatever happens to this kernel: `%cortex job ID` shows it again after a restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.magic_arguments import argument, magic_arguments

from .registry import noninteractive, subcommand

if TYPE_CHECKING:
    from . import CortexMagics


@subcommand(
    "train", "cell", "fine-tune with LoRA from a YAML spec in the cell, on the backend; shows a live widget"
)
@magic_arguments(name="cortex train")
@argument("--name", help="a name for the job")
@argument(
    "-o",
    "--output",
    metavar="VAR",
    help="store the TrainingJob in VAR (otherwise it is the cell's result, _)",
)
@argument("--priority", type=int, help="queue band 0-9, higher first (default 5)")
@argument(
    "--budget",
    metavar="TIME",
    help="device-seconds the run may use (e.g. 600, 90s, 10m, 1h); spent, it stops and saves 'final'",
)
@argument(
    "--wait", action="store_true", help="block until training ends (Ctrl-C stops watching; the run goes on)"
)
def train_command(self: CortexMagics, args: Any, cell: str | None):
    """Fine-tune a model with LoRA. The cell body is a YAML spec (keys below). The backend runs the
    training loop; the cell returns at once and the widget follows the run, which goes on if this
    kernel restarts (%cortex job ID shows it again)."""
    from ..job_state import JobState
    from ..train_spec import parse_budget, parse_train_spec

    client = self.client()
    # The cell's first line is the %%cortex line: with it standing in as a blank line, the spec's errors
    # name the lines as the cell numbers them.
    spec = parse_train_spec("\n" + (cell or ""))
    if args.budget is not None:
        spec.budget_device_s = parse_budget(args.budget, "--budget")
    job = client.train(spec, name=args.name, namespace=self.shell.user_ns, priority=args.priority)
    state = JobState(job.job_id, args.name, spec.base_model)
    state.set_job(job.info)
    if noninteractive():
        print(f"{job.job_id}: training {spec.base_model} on the backend: {_plan(spec)}")
        completed = watch(job, state)
    else:
        from ..widgets.job_widget import JobWidget, remember_widget

        widget = JobWidget(client, state)
        remember_widget(widget)
        widget.show()
        completed = watch(job, state, printer=False) if args.wait else True
        if args.wait:
            widget.settle()
    if args.wait or noninteractive():
        print(state.summary())
        if not completed:
            print(interrupted_note(job.job_id, state))
    if args.output:
        self.shell.user_ns[args.output] = job
        return None
    return job


def _plan(spec: Any) -> str:
    length = f"{spec.steps} steps" if spec.steps is not None else f"{spec.epochs:g} epochs"
    return f"{length} of {spec.batch_size} x {spec.max_seq_len} tokens"


def watch(job: Any, state: Any, printer: bool = True) -> bool:
    """Block until the run's training ends, feeding `state` (and printing progress lines); False if
    Ctrl-C stopped the watching (the run itself goes on)."""
    from ..progress_text import ProgressPrinter

    progress = ProgressPrinter(state) if printer else None

    def update(info: dict) -> None:
        state.set_job(info)
        if progress is not None:
            progress.tick()

    try:
        job.wait(on_update=update)
    except KeyboardInterrupt:
        return False
    return True


def interrupted_note(job_id: str, state: Any) -> str:
    """What Ctrl-C left behind: the run goes on; how to see it or stop it."""
    return (
        f"stopped watching {job_id} at step {state.step}"
        + (f"/{state.total_steps}" if state.total_steps else "")
        + f"; it goes on training on the backend: %cortex job {job_id} shows it, %cortex cancel {job_id} stops it"
    )
