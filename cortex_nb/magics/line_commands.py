"""The line subcommands: connect, status, capacity, models, jobs, job, logs, cancel, compare, help
(checkpoints: checkpoints.py).

Tables come back as DataFrames (so `df = %cortex jobs` works); the rest print.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from .. import discovery, errors
from ..protocol.states import JOB_STATES, JOB_TERMINAL, clock, display_state
from .registry import NOTIFY, noninteractive, subcommand

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
        f"/{capacity['slots_total']} free"
        + (
            f", adapter slots {capacity['adapter_slots_available']}/{capacity['adapter_slots_total']} free"
            if capacity.get("adapter_slots_total")
            else ""
        )
        + f", {capacity.get('pending', 0)} job(s) queued"
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
    """Devices and their slots, as a DataFrame; adapter hosts (a base shared by training slots) as lines."""
    from ..views import adapter_host_lines, capacity_frame, hosting_line, quantized_models_line

    capacity = self.client().get_capacity()
    source_runs = capacity.get("source_runs") or {}
    if source_runs.get("sandbox") == "none":
        # Unsandboxed (allowed by the operator) or refused: either way the user must know before submitting.
        print(f"source runs: {source_runs['note']}")
    hosting = hosting_line(capacity)
    if hosting:
        print(hosting)
    for line in adapter_host_lines(capacity):
        print(line)
    quantized = quantized_models_line(capacity)
    if quantized:
        print(quantized)
    return capacity_frame(capacity)


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
@argument(
    "--all",
    action="store_true",
    help="also the short-lived jobs %%cortex compare and sampling a finished run start (hidden by default)",
)
def jobs_command(self: CortexMagics, args: Any, cell: str | None):
    """Jobs visible to this token, newest first, as a DataFrame: state (one word: queued, starting,
    training, sampling, idle, done, failed, cancelled), step, loss per token, eval loss per token,
    duration, and learning rate, LoRA rank, batch size and planned steps. The short-lived jobs that
    `%cortex compare` and sampling on demand start are left out, as in the sidebar; `--all` lists them."""
    from ..views import jobs_frame

    return jobs_frame(self.client().list_jobs(status=args.status, limit=args.limit, short_lived=args.all))


@subcommand(
    "stats", "line", "jobs and runs by state, queue wait, device-hours per owner and model (DataFrame)"
)
@magic_arguments(name="cortex stats")
@argument("--days", type=float, default=7.0, help="the window: this many days up to now (default 7)")
@argument("--owner", help="whose work (an admin's token only; default: your own, or everyone's for an admin)")
@argument("--no-plot", action="store_true", help="the DataFrame only, without the chart above it")
def stats_command(self: CortexMagics, args: Any, cell: str | None):
    """Statistics the backend computes over a window (GET /v1/stats), one row per figure: jobs and runs
    created in it by state, their queue wait (median, p95), and device-hours spent in it per owner and
    per model. Above the DataFrame, a chart of the queue wait and the device-hours per owner."""
    import time

    from IPython.display import display

    from ..views import stats_frame
    from ..widgets.stats_chart import StatsChart

    if args.days <= 0:
        raise UsageError("--days must be more than 0")
    until = time.time()
    stats = self.client().stats(until - args.days * 86400, until, args.owner)
    if not args.no_plot:
        display(StatsChart(stats))
    return stats_frame(stats)


@subcommand("usage", "line", "device-seconds used per user and per job over a window (DataFrame)")
@magic_arguments(name="cortex usage")
@argument("--days", type=float, default=30.0, help="the window: this many days up to now (default 30)")
@argument("--owner", help="whose work (an admin's token only; default: your own, or everyone's for an admin)")
def usage_command(self: CortexMagics, args: Any, cell: str | None):
    """Device-seconds spent in a window, as GET /v1/stats counts them (each sub-job holds one device slot
    from its job's start to its end; a source run its devices): one row per user, then one per job,
    most first. A run's `budget` is spent against the same count."""
    import time

    from ..views import usage_frame

    if args.days <= 0:
        raise UsageError("--days must be more than 0")
    until = time.time()
    return usage_frame(self.client().stats(until - args.days * 86400, until, args.owner))


@subcommand("speedtest", "line", "measure the link to the backend: upload and download MB/s, latency")
@magic_arguments(name="cortex speedtest")
@argument("--mb", type=float, default=8.0, help="MB sent each way (default 8, at most 33)")
def speedtest_command(self: CortexMagics, args: Any, cell: str | None) -> None:
    """Time round trips, a download and an upload against the backend (GET/POST /v1/speedtest) and print
    the figures; large uploads then show an ETA from them."""
    from ..link_speed import describe

    print(describe(self.client().speedtest(args.mb)))


@subcommand("job", "line", "a live widget for an existing job (also after a kernel restart)")
@magic_arguments(name="cortex job")
@argument("job_id")
def job_command(self: CortexMagics, args: Any, cell: str | None):
    """Show a job live, from the backend's record of it (its progress: steps, loss and eval curves,
    samples; logs; device metrics): a run started in another kernel, or before a restart, is shown
    where it really is, and goes on advancing. In a kernel not yet connected, this user's running local
    backend is used when the job is there."""
    self.local_connection_with(args.job_id)
    client = self.client()
    if noninteractive():
        from ..job_state import JobState

        state = JobState(args.job_id)
        state.set_job(client.get_job(args.job_id))
        print(state.summary())
        return None
    from ..widgets.job_widget import show_job

    show_job(client, args.job_id)
    return None


@subcommand(
    "notify", "line", "a note in the cell when a watched run ends, fails or starts waiting (off by default)"
)
@magic_arguments(name="cortex notify")
@argument("state", nargs="?", choices=("on", "off"), help="on or off; without it, print the setting")
def notify_command(self: CortexMagics, args: Any, cell: str | None) -> None:
    """Turn on (or off) a note under each job widget of this kernel when its run ends, fails or starts
    waiting for a device. Off by default (notebooks checked by nbval keep their outputs); JupyterLab's
    bell tells the same from the sidebar."""
    if args.state is not None:
        NOTIFY["on"] = args.state == "on"
    print(f"cortex notify: {'on' if NOTIFY['on'] else 'off'}")


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
    # Shown here, once; returning it as well would show it a second time (IPython displays a cell's
    # value). `-o VAR` keeps it.
    if noninteractive():
        print(comparison.text())
    else:
        comparison.show()
    if args.output:
        self.shell.user_ns[args.output] = comparison
    return None
