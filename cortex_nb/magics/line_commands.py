"""The line subcommands: connect, status, capacity, models, jobs, job, logs, cancel, checkpoints, compare,
help.

Tables come back as DataFrames (so `df = %cortex jobs` works); the rest print.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from .. import discovery, errors
from ..protocol.states import JOB_STATES, JOB_TERMINAL, clock, display_state
from ..train_spec import save_supported
from .registry import checkpoints_supported, noninteractive, subcommand

if TYPE_CHECKING:
    from . import CortexMagics


@subcommand("connect", "line", "connect to a backend (profile, URL, --local, or discovered)")
@magic_arguments(name="cortex connect")
@argument("target", nargs="?", help="a profile name or a backend URL (http://host:port or https://host:port)")
@argument("--token-env", metavar="VAR", help="with a URL: read the token from $VAR (default $CORTEX_TOKEN)")
@argument(
    "--verify", metavar="PIN_OR_CA", help="with an https URL: a sha256:... fingerprint to pin, or a CA file"
)
@argument(
    "--local",
    action="store_true",
    help="your local backend on this machine (found through its state file, or started; it outlives the kernel)",
)
@argument("--data-dir", metavar="DIR", help="with --local: the local backend's data dir")
def connect_command(self: CortexMagics, args: Any, cell: str | None) -> None:
    """Connect to a cortex backend. With no argument it tries, in order: env CORTEX_URL/CORTEX_TOKEN,
    the default profile, the proxy of the Jupyter server running this kernel (the backend token never
    enters the kernel), then prints how to connect."""
    if args.local:
        connection = discovery.connect_local(args.data_dir)
    elif args.target and "://" in args.target:
        connection = discovery.connect_url(args.target, args.token_env, args.verify)
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
    try:
        me = client.whoami()
        token = f"owner {me.get('owner')}, scopes {', '.join(me.get('scopes', []))}"
    except errors.CortexError as exc:
        if exc.code != "route_not_proxied":
            raise
        token = "the Jupyter server's (token details are not forwarded by its proxy)"
    capacity = client.get_capacity()
    jobs = client.list_jobs(limit=500)
    counts: dict[str, int] = {}
    for job in jobs:
        word = display_state(job)[0]
        counts[word] = counts.get(word, 0) + 1
    kinds = sorted({device.get("kind", "?") for device in capacity["devices"]})
    print(self.connection.describe())
    print(f"backend {version.get('service')} {version.get('version')}, API {version.get('api_version')}")
    print(f"token: {token}")
    samplers = sorted({device["sampler"] for device in capacity["devices"] if device.get("sampler")})
    print(
        f"devices: {len(capacity['devices'])} ({', '.join(kinds)}), slots {capacity['slots_available']}"
        f"/{capacity['slots_total']} free, {capacity.get('pending', 0)} job(s) queued"
        + (f"; sampling with {', '.join(samplers)}" if samplers else "")
    )
    print("jobs: " + (", ".join(f"{count} {word}" for word, count in sorted(counts.items())) or "none"))
    for row in capacity.get("pending_jobs") or []:
        estimate = f" (about {clock(row['estimate_s'])})" if row.get("estimate_s") is not None else ""
        name = f"{row['name']} ({row['job_id']})" if row.get("name") else row["job_id"]
        print(f"  queued #{row['position']}: {name}: {row['reason']}{estimate}")


@subcommand("capacity", "line", "devices, slots in use and available, sampling engine (DataFrame)")
@magic_arguments(name="cortex capacity")
def capacity_command(self: CortexMagics, args: Any, cell: str | None):
    """Devices and their slots, as a DataFrame."""
    from ..views import capacity_frame

    return capacity_frame(self.client().get_capacity())


@subcommand("models", "line", "models this backend can load (DataFrame)")
@magic_arguments(name="cortex models")
def models_command(self: CortexMagics, args: Any, cell: str | None):
    """The built-in and registered models, as a DataFrame."""
    from ..views import models_frame

    return models_frame(self.client().list_models())


@subcommand("jobs", "line", "your jobs, newest first, with step, loss and key hyperparameters (DataFrame)")
@magic_arguments(name="cortex jobs")
@argument("--status", choices=JOB_STATES, help="only jobs whose backend status is this")
@argument("--limit", type=int, default=50, help="at most this many (default 50)")
def jobs_command(self: CortexMagics, args: Any, cell: str | None):
    """Jobs visible to this token, newest first, as a DataFrame: state (one word: queued, starting,
    training, sampling, idle, done, failed, cancelled), step, loss per token, eval loss per token,
    duration, and learning rate, LoRA rank, batch size and planned steps."""
    from ..views import jobs_frame

    return jobs_frame(self.client().list_jobs(status=args.status, limit=args.limit))


@subcommand("job", "line", "a live widget for an existing job (also after a kernel restart)")
@magic_arguments(name="cortex job")
@argument("job_id")
def job_command(self: CortexMagics, args: Any, cell: str | None):
    """Show a job live, from the backend's record of it (its progress: steps, loss and eval curves,
    samples; logs; device metrics): a run started in another kernel, or before a restart, is shown
    where it really is, and goes on advancing."""
    client = self.client()
    if noninteractive():
        from ..job_state import JobState

        state = JobState(args.job_id)
        state.set_job(client.get_job(args.job_id))
        print(state.summary())
        return None
    from ..widgets.job_widget import show_job

    show_job(client, args.job_id, save_supported())
    return None


@subcommand("logs", "line", "print a job's last log lines; -f follows new ones")
@magic_arguments(name="cortex logs")
@argument("job_id")
@argument("-n", "--lines", type=int, default=50, help="how many of the last lines (default 50)")
@argument(
    "-f", "--follow", action="store_true", help="keep printing new lines until the job ends (Ctrl-C stops)"
)
def logs_command(self: CortexMagics, args: Any, cell: str | None) -> None:
    """Print a job's log tail; with -f keep following it."""
    client = self.client()
    tail: deque[str] = deque(maxlen=max(args.lines, 0))
    cursor, dropped = 0, 0
    while True:
        page = client.tail_logs(args.job_id, cursor, limit=5000)
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
            page = client.tail_logs(args.job_id, cursor, wait_s=10.0)
            cursor = page["cursor"]
            for line in page["lines"]:
                print(line["line"], flush=True)
            if page.get("job_status") in JOB_TERMINAL and not page["lines"]:
                print(f"[job {args.job_id} is {page['job_status']}]")
                return
    except KeyboardInterrupt:
        print(f"[stopped following {args.job_id}]")


@subcommand("cancel", "line", "cancel a job now (idempotent; nothing is saved)")
@magic_arguments(name="cortex cancel")
@argument("job_id")
def cancel_command(self: CortexMagics, args: Any, cell: str | None) -> None:
    """Cancel a job on the backend: its training stops at once and nothing more is saved. To keep a
    trained adapter, free its device with job.complete() instead (it saves checkpoint 'final')."""
    job = self.client().cancel_job(args.job_id)
    note = f" ({job['failure_code']})" if job.get("failure_code") and job["status"] != "cancelled" else ""
    print(f"{args.job_id}: {job['status']}{note}")


@subcommand("checkpoints", "line", "a job's checkpoints (DataFrame)", available=checkpoints_supported)
@magic_arguments(name="cortex checkpoints")
@argument("job_id")
def checkpoints_command(self: CortexMagics, args: Any, cell: str | None):
    """A job's checkpoints, as a DataFrame."""
    from ..training import TrainingJob

    client = self.client()
    return TrainingJob(client, client.get_job(args.job_id)).checkpoints()


@subcommand("compare", "line", "compare runs: loss curves, hyperparameters and final metrics, A/B samples")
@magic_arguments(name="cortex compare")
@argument("job_ids", nargs="+", metavar="ID", help="two or more jobs")
@argument(
    "--prompt",
    action="append",
    metavar="TEXT",
    help="a prompt to sample from each (repeatable; default: the runs' own sample prompts)",
)
@argument("--max-tokens", type=int, default=32, help="tokens to sample per prompt (default 32)")
@argument("--no-samples", action="store_true", help="only curves and the table: start no sampling job")
@argument("-o", "--output", metavar="VAR", help="store the Comparison in VAR")
def compare_command(self: CortexMagics, args: Any, cell: str | None):
    """Compare runs: overlaid loss and eval curves, a table of hyperparameters and final metrics, and
    the same prompts sampled greedily from each run's last checkpoint ('final' where there is one) side
    by side, with per-token logprob differences (an A/B view)."""
    from .. import compare

    if len(args.job_ids) < 2:
        raise UsageError("cortex compare: give two or more job ids")
    comparison = compare(
        args.job_ids,
        client=self.client(),
        prompts=args.prompt,
        max_tokens=args.max_tokens,
        samples=not args.no_samples,
    )
    if noninteractive():
        print(comparison.text())
    else:
        comparison.show()
    if args.output:
        self.shell.user_ns[args.output] = comparison
        return None
    return comparison
