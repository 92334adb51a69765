"""`%%cortex train`: parse the YAML spec, load and pack the data, create the job, and start the
pipelined loop behind a live widget (or blocking, with text progress, when non-interactive)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.magic_arguments import argument, magic_arguments

from ..train_spec import save_supported
from .registry import noninteractive, subcommand

if TYPE_CHECKING:
    from . import CortexMagics


@subcommand("train", "cell", "fine-tune with LoRA from a YAML spec in the cell; shows a live widget")
@magic_arguments(name="cortex train")
@argument("--name", help="a name for the job")
@argument("-o", "--output", metavar="VAR", help="store the TrainingJob in VAR (otherwise it is the cell's result, _)")
@argument("--wait", action="store_true", help="block until training ends (Ctrl-C stops it)")
def train_command(self: CortexMagics, args: Any, cell: str | None):
    """Fine-tune a model with LoRA. The cell body is a YAML spec (keys below). Training runs on a
    background thread; the notebook stays usable while the widget shows progress."""
    from ..kernel_threads import capture_parent
    from ..progress_text import ProgressPrinter
    from ..train_data import load_examples, tokenize_and_pack
    from ..train_loop import TrainingRun, wait_for_run
    from ..train_spec import parse_train_spec
    from ..training import TrainingJob
    from ..widgets.state import JobState

    client = self.client()
    spec = parse_train_spec(cell or "")
    namespace = self.shell.user_ns
    examples = load_examples(spec.data, namespace, "data")
    eval_examples = load_examples(spec.eval.data, namespace, "eval.data") if spec.eval else None
    data = tokenize_and_pack(client, spec.base_model, examples, spec.max_seq_len, spec.packing)
    eval_data = (tokenize_and_pack(client, spec.base_model, eval_examples, spec.max_seq_len, spec.packing)
                 if eval_examples else None)
    job = TrainingJob.create(client, spec.base_model, lora=spec.lora, optimizer=spec.optimizer, seed=spec.seed,
                             name=args.name, wait=False)
    state = JobState(job.job_id, args.name, spec.base_model)
    state.set_job(job.info)
    run = TrainingRun(job, spec, data, eval_data, state)
    blocking = args.wait or noninteractive()
    if noninteractive():
        print(f"{job.job_id}: training {spec.base_model} for {run.total_steps} steps of {spec.batch_size} x "
              f"{spec.max_seq_len} tokens ({data.examples} examples, {data.tokens} tokens, {len(data.rows)} rows)")
        printer = ProgressPrinter(state)
        run.start()
        completed = wait_for_run(run, printer.tick)
    else:
        from ..widgets.job_widget import JobWidget, remember_widget

        widget = JobWidget(client, state, run, save_supported())
        remember_widget(widget)
        widget.show()
        run.start(capture_parent())
        completed = wait_for_run(run) if blocking else True
        if blocking:
            widget.throttle.flush()
    if blocking:
        print(state.summary())
        if not completed:
            print(interrupted_note(run))
    if args.output:
        namespace[args.output] = job
        return None
    return job


def interrupted_note(run: Any) -> str:
    """What Ctrl-C left behind, and how to go on from there."""
    job_id = run.job.job_id
    text = (f"interrupted: stopped {job_id} at step {run.state.step}/{run.total_steps}; its queued requests"
            f" were cancelled and the job stays up (%cortex cancel {job_id} ends it)")
    if run.last_checkpoint:
        text += f"; last checkpoint {run.last_checkpoint!r}: resume with .load({run.last_checkpoint!r}) on this job or a new one"
    elif save_supported():
        text += "; no checkpoint was saved (add save: {every: N} to the spec)"
    return text
