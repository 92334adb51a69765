"""`%cortex` / `%%cortex`: the notebook front of cortex-nb.

One magic, many subcommands, each parsed by IPython's `magic_arguments`. Problems print one
`UsageError:` line naming what went wrong (no traceback) and end the cell as failed, so "Run all"
stops where the problem is. Blocking calls turn Ctrl-C into a cancel on the backend.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from . import discovery, errors
from .states import JOB_STATES, JOB_TERMINAL
from .train_spec import LORA_KEYS, OPTIMIZER_KEYS, SpecError, accepted_keys, save_supported


def noninteractive() -> bool:
    """CORTEX_NONINTERACTIVE=1 (CI, nbval, papermill): block, print text progress, no widgets."""
    return os.environ.get("CORTEX_NONINTERACTIVE", "").strip().lower() in ("1", "true", "yes")


def checkpoints_supported() -> bool:
    from .client import Client

    return callable(getattr(Client, "list_checkpoints", None))


@dataclass
class Subcommand:
    name: str
    func: Callable[..., Any]
    kind: str  # "line" or "cell"
    summary: str


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(name: str, kind: str, summary: str, available: Callable[[], bool] | None = None):
    def register(func: Callable[..., Any]) -> Callable[..., Any]:
        if available is None or available():
            SUBCOMMANDS[name] = Subcommand(name, func, kind, summary)
        return func

    return register


# line subcommands ---------------------------------------------------------------------------------
@subcommand("connect", "line", "connect to a backend (profile, URL, --local, or discovered)")
@magic_arguments(name="cortex connect")
@argument("target", nargs="?", help="a profile name or a backend URL (http://host:port)")
@argument("--token-env", metavar="VAR", help="with a URL: read the token from $VAR (default $CORTEX_TOKEN)")
@argument("--local", action="store_true", help="start (or reuse) an embedded backend on this machine")
@argument("--data-dir", metavar="DIR", help="with --local: the embedded backend's data dir")
def connect_command(self: CortexMagics, args: Any, cell: str | None) -> None:
    """Connect to a cortex backend. With no argument it tries, in order: env CORTEX_URL/CORTEX_TOKEN,
    the default profile, then prints how to connect. (Discovery through the Jupyter server proxy
    arrives with the cortex server extension.)"""
    if args.local:
        connection = discovery.connect_local(args.data_dir)
    elif args.target and "://" in args.target:
        connection = discovery.connect_url(args.target, args.token_env)
    elif args.target:
        connection = discovery.connect_profile(args.target)
    else:
        connection = discovery.discover()
        if connection is None:
            print(discovery.how_to_connect())
            return
    self.set_connection(connection)
    print(connection.describe())


@subcommand("status", "line", "connection, backend version, token, devices and jobs at a glance")
@magic_arguments(name="cortex status")
def status_command(self: CortexMagics, args: Any, cell: str | None) -> None:
    """Print where this notebook is connected and what the backend holds."""
    client = self.client()
    version = client.check_version()
    me = client.whoami()
    capacity = client.get_capacity()
    jobs = client.list_jobs(limit=500)
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["status"]] = counts.get(job["status"], 0) + 1
    kinds = sorted({device.get("kind", "?") for device in capacity["devices"]})
    print(self.connection.describe())
    print(f"backend {version.get('service')} {version.get('version')}, API {version.get('api_version')}")
    print(f"token: owner {me.get('owner')}, scopes {', '.join(me.get('scopes', []))}")
    print(f"devices: {len(capacity['devices'])} ({', '.join(kinds)}), slots {capacity['slots_available']}"
          f"/{capacity['slots_total']} free, {capacity.get('pending', 0)} job(s) queued")
    print("jobs: " + (", ".join(f"{count} {status}" for status, count in sorted(counts.items())) or "none"))


@subcommand("capacity", "line", "devices, slots in use and available (DataFrame)")
@magic_arguments(name="cortex capacity")
def capacity_command(self: CortexMagics, args: Any, cell: str | None):
    """Devices and their slots, as a DataFrame."""
    from .views import capacity_frame

    return capacity_frame(self.client().get_capacity())


@subcommand("models", "line", "models this backend can load (DataFrame)")
@magic_arguments(name="cortex models")
def models_command(self: CortexMagics, args: Any, cell: str | None):
    """The built-in and registered models, as a DataFrame."""
    from .views import models_frame

    return models_frame(self.client().list_models())


@subcommand("jobs", "line", "your jobs, newest first (DataFrame)")
@magic_arguments(name="cortex jobs")
@argument("--status", choices=JOB_STATES, help="only jobs in this state")
@argument("--limit", type=int, default=50, help="at most this many (default 50)")
def jobs_command(self: CortexMagics, args: Any, cell: str | None):
    """Jobs visible to this token, newest first, as a DataFrame."""
    from .views import jobs_frame

    return jobs_frame(self.client().list_jobs(status=args.status, limit=args.limit))


@subcommand("job", "line", "a live widget for an existing job (also after a kernel restart)")
@magic_arguments(name="cortex job")
@argument("job_id")
def job_command(self: CortexMagics, args: Any, cell: str | None):
    """Show a job live: this kernel's run if it started it, otherwise rebuilt from the backend (status,
    steps and loss from its requests, logs, device metrics)."""
    client = self.client()
    if noninteractive():
        from .job_feed import RequestProgress
        from .widgets.state import JobState

        state = JobState(args.job_id)
        state.set_job(client.get_job(args.job_id))
        RequestProgress(client, args.job_id).poll(state, limit=400)
        print(state.summary())
        return None
    from .widgets.job_widget import show_job

    show_job(client, args.job_id, save_supported())
    return None


@subcommand("logs", "line", "print a job's last log lines; -f follows new ones")
@magic_arguments(name="cortex logs")
@argument("job_id")
@argument("-n", "--lines", type=int, default=50, help="how many of the last lines (default 50)")
@argument("-f", "--follow", action="store_true", help="keep printing new lines until the job ends (Ctrl-C stops)")
def logs_command(self: CortexMagics, args: Any, cell: str | None) -> None:
    """Print a job's log tail; with -f keep following it."""
    from .job_feed import read_log_page

    client = self.client()
    tail: deque[str] = deque(maxlen=max(args.lines, 0))
    cursor, dropped = 0, 0
    while True:
        page = read_log_page(client, args.job_id, cursor, limit=5000)
        dropped += page.get("dropped", 0)
        tail.extend(line["line"] for line in page["lines"])
        cursor = page["cursor"]
        if not page["lines"]:
            break
    if dropped:
        print(f"[{dropped} older lines were dropped by the backend's log retention]")
    for line in tail:
        print(line)
    if not args.follow:
        return
    try:
        while True:
            page = read_log_page(client, args.job_id, cursor, wait_s=10.0)
            cursor = page["cursor"]
            for line in page["lines"]:
                print(line["line"], flush=True)
            if page.get("job_status") in JOB_TERMINAL and not page["lines"]:
                print(f"[job {args.job_id} is {page['job_status']}]")
                return
    except KeyboardInterrupt:
        print(f"[stopped following {args.job_id}]")


@subcommand("cancel", "line", "cancel a job (idempotent)")
@magic_arguments(name="cortex cancel")
@argument("job_id")
def cancel_command(self: CortexMagics, args: Any, cell: str | None) -> None:
    """Cancel a job on the backend; a training loop this kernel runs for it stops too."""
    from .train_loop import live_run
    from .widgets.state import RUN_CANCELLED

    run = live_run(args.job_id)
    if run is not None and not run.done:
        run.stop(RUN_CANCELLED)
    job = self.client().cancel_job(args.job_id)
    note = f" ({job['failure_code']})" if job.get("failure_code") and job["status"] != "cancelled" else ""
    print(f"{args.job_id}: {job['status']}{note}")


@subcommand("checkpoints", "line", "a job's checkpoints (DataFrame)", available=checkpoints_supported)
@magic_arguments(name="cortex checkpoints")
@argument("job_id")
def checkpoints_command(self: CortexMagics, args: Any, cell: str | None):
    """A job's checkpoints, as a DataFrame."""
    from .training import TrainingJob

    client = self.client()
    return TrainingJob(client, client.get_job(args.job_id)).checkpoints()


@subcommand("help", "line", "this overview, or one subcommand's options")
@magic_arguments(name="cortex help")
@argument("name", nargs="?", help="a subcommand")
def help_command(self: CortexMagics, args: Any, cell: str | None) -> None:
    """Print the overview, or the full options of one subcommand."""
    if args.name is None:
        print(overview())
        return
    if args.name not in SUBCOMMANDS:
        raise UsageError(f"no subcommand {args.name!r}; subcommands: {', '.join(SUBCOMMANDS)}")
    print(SUBCOMMANDS[args.name].func.__doc__)


# cell subcommands ---------------------------------------------------------------------------------
@subcommand("train", "cell", "fine-tune with LoRA from a YAML spec in the cell; shows a live widget")
@magic_arguments(name="cortex train")
@argument("--name", help="a name for the job")
@argument("-o", "--output", metavar="VAR", help="store the TrainingJob in VAR (otherwise it is the cell's result, _)")
@argument("--wait", action="store_true", help="block until training ends (Ctrl-C stops it)")
def train_command(self: CortexMagics, args: Any, cell: str | None):
    """Fine-tune a model with LoRA. The cell body is a YAML spec (keys below). Training runs on a
    background thread; the notebook stays usable while the widget shows progress."""
    from .kernel_threads import capture_parent
    from .progress_text import ProgressPrinter
    from .train_data import load_examples, tokenize_and_pack
    from .train_loop import TrainingRun, wait_for_run
    from .train_spec import parse_train_spec
    from .training import TrainingJob
    from .widgets.state import JobState

    client = self.client()
    spec = parse_train_spec(cell or "")
    namespace = self.shell.user_ns
    examples = load_examples(spec.data, namespace, "data")
    eval_examples = load_examples(spec.eval.data, namespace, "eval.data") if spec.eval else None
    data = tokenize_and_pack(client, spec.base_model, examples, spec.max_seq_len)
    eval_data = tokenize_and_pack(client, spec.base_model, eval_examples, spec.max_seq_len) if eval_examples else None
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
        from .widgets.job_widget import JobWidget, remember_widget

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


@subcommand("sample", "cell", "sample from a job or a model; one prompt per line (DataFrame)")
@magic_arguments(name="cortex sample")
@argument("--job", metavar="ID", help="sample from this job (its trained weights)")
@argument("--model", metavar="NAME", help="sample from a base model (a short-lived sampling job)")
@argument("--n", type=int, help="samples per prompt (default 1)")
@argument("--temperature", type=float, help="0 is greedy (default 1.0)")
@argument("--max-tokens", type=int, default=64, help="tokens to generate per sample (default 64)")
@argument("--top-p", type=float, help="nucleus sampling threshold (default 1.0)")
@argument("--seed", type=int, help="make sampling reproducible")
@argument("-o", "--output", metavar="VAR", help="store the DataFrame in VAR (otherwise it is the cell's result, _)")
def sample_command(self: CortexMagics, args: Any, cell: str | None):
    """Sample completions. The cell holds one prompt per line, or a YAML list of prompts. Returns a
    DataFrame of prompt, sample, logprob and finish_reason. Ctrl-C cancels the request."""
    from .training import Sampler, TrainingJob

    if bool(args.job) == bool(args.model):
        raise UsageError("cortex sample: give exactly one of --job ID or --model NAME")
    prompts = parse_prompts(cell or "")
    sampling = {key: value for key, value in (("n", args.n), ("temperature", args.temperature),
                ("max_tokens", args.max_tokens), ("top_p", args.top_p), ("seed", args.seed)) if value is not None}
    client = self.client()
    sampler = None
    future = None
    try:
        if args.job:
            handle = TrainingJob(client, client.get_job(args.job))
        else:
            sampler = handle = Sampler.create(client, args.model, name="%%cortex sample")
        future = handle.generate(prompts, **sampling)
        frame = future.result().to_dataframe()
    except KeyboardInterrupt:
        if future is not None:
            future.cancel()
        if sampler is not None:
            sampler.cancel()
            sampler = None
        print("interrupted: the generate request was cancelled on the backend")
        return None
    finally:
        if sampler is not None:
            sampler.complete()
    if args.output:
        self.shell.user_ns[args.output] = frame
        return None
    return frame


def parse_prompts(body: str) -> list[str]:
    """One prompt per non-empty line, or a YAML list of strings (for prompts with newlines)."""
    stripped = body.strip()
    if stripped.startswith("- ") or stripped.startswith("["):
        import yaml

        try:
            prompts = yaml.safe_load(stripped)
        except yaml.YAMLError as exc:
            raise UsageError(f"cortex sample: the prompt list is not valid YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise UsageError("cortex sample: a YAML prompt list must hold strings only")
    else:
        prompts = [line for line in body.splitlines() if line.strip()]
    if not prompts:
        raise UsageError("cortex sample: the cell holds no prompts; write one prompt per line")
    return prompts


def interrupted_note(run: Any) -> str:
    """What Ctrl-C left behind, and how to go on from there."""
    text = (f"interrupted: stopped {run.job.job_id} at step {run.state.step}/{run.total_steps}; its queued requests"
            " were cancelled and the job stays up (job.cancel() ends it)")
    if run.last_checkpoint:
        text += f"; last checkpoint {run.last_checkpoint!r}: resume with job.load({run.last_checkpoint!r})"
    elif save_supported():
        text += "; no checkpoint was saved (add save: {every: N} to the spec)"
    return text


# the magic ------------------------------------------------------------------------------------------
@magics_class
class CortexMagics(Magics):
    """Holds this kernel's connection; `%cortex` dispatches to the subcommands above."""

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self.connection: discovery.Connection | None = None

    def set_connection(self, connection: discovery.Connection) -> None:
        # The previous client stays open: runs and widgets started through it keep using it.
        self.connection = connection

    def client(self):
        if self.connection is None:
            raise UsageError("not connected: run %cortex connect first (or %cortex connect --local)")
        return self.connection.client

    @line_cell_magic
    def cortex(self, line: str, cell: str | None = None):
        name, _, rest = line.strip().partition(" ")
        if not name:
            print(overview())
            return None
        command = SUBCOMMANDS.get(name)
        if command is None:
            raise UsageError(f"cortex: no subcommand {name!r}; subcommands: {', '.join(SUBCOMMANDS)} (see %cortex?)")
        if command.kind == "cell" and cell is None:
            raise UsageError(f"cortex {name} is a cell magic: write %%cortex {name} on the first line of a cell")
        if command.kind == "line" and cell is not None:
            raise UsageError(f"cortex {name} is a line magic: use %cortex {name} (one percent sign)")
        try:
            args = parse_argstring(command.func, rest)
        except UsageError as exc:
            raise UsageError(f"cortex {name}: {exc} (see %cortex help {name})") from None
        try:
            return command.func(self, args, cell)
        except SpecError as exc:
            raise UsageError(f"cortex {name}: {one_line(exc.message)}") from None
        except errors.CortexError as exc:
            raise UsageError(f"cortex {name}: [{exc.code}] {one_line(exc.message)}") from None


def one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] + (" …" if len(lines) > 1 else "") if lines else ""


def overview() -> str:
    """The text `%cortex?` and `%cortex` show: every subcommand, then each one's options."""
    lines = ["%cortex SUBCOMMAND [options]      line subcommands", "%%cortex train|sample [options]  cell subcommands (the cell is the body)", ""]
    for kind in ("line", "cell"):
        lines.append("Line subcommands:" if kind == "line" else "Cell subcommands:")
        lines.extend(f"  {c.name:<12} {c.summary}" for c in SUBCOMMANDS.values() if c.kind == kind)
        lines.append("")
    lines.append(train_keys_help())
    lines.append("")
    lines.append("Set CORTEX_NONINTERACTIVE=1 (CI, nbval) to block and print text progress instead of widgets.")
    lines.append("Errors print one line. Ctrl-C in a blocking cell cancels the request on the backend.")
    lines.append("")
    lines.append("Options of each subcommand")
    lines.append("--------------------------")
    for command in SUBCOMMANDS.values():
        lines.append((command.func.__doc__ or "").strip())
        lines.append("")
    return "\n".join(lines)


def train_keys_help() -> str:
    keys = accepted_keys()
    rows = [
        ("base_model", "a model name from %cortex models (default tiny)"),
        ("lora", f"{{{', '.join(LORA_KEYS)}}}"),
        ("optimizer", f"{{{', '.join(OPTIMIZER_KEYS)}}} (AdamW; lr default 1e-4)"),
        ("data", "a JSONL path (rows with text, or prompt + completion) or $variable (list of dicts, DataFrame)"),
        ("batch_size", "packed rows per step (default 8)"),
        ("max_seq_len", "tokens per packed row (default 128)"),
        ("steps", "optimizer steps (give steps or epochs)"),
        ("epochs", "passes over the data (give steps or epochs)"),
        ("eval", "{every, data, max_rows}: eval loss on held-out rows every N steps and at the end"),
        ("sample", "{every, prompts, max_tokens, temperature}: greedy samples every N steps and at the end"),
        ("save", "{every, type}: a checkpoint every N steps and at the end (type resumable|weights-only)"),
        ("seed", "shuffling and LoRA init seed (default 0)"),
    ]
    text = ["%%cortex train spec keys (YAML; unknown keys are refused):"]
    text.extend(f"  {key:<12} {meaning}" for key, meaning in rows if key in keys)
    if "save" not in keys:
        text.append("  (save: arrives with checkpoints in the SDK)")
    return "\n".join(text)


CortexMagics.cortex.__doc__ = overview()


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(CortexMagics)


def unload_ipython_extension(ipython: Any) -> None:
    for kind in ("line", "cell"):
        ipython.magics_manager.magics[kind].pop("cortex", None)
    ipython.magics_manager.registry.pop("CortexMagics", None)
