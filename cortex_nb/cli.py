"""The `cortex-nb` command: `demo`, `run`/`runs` (source runs), `backend serve|token` for the GPU host, and
`host join|list` for the hosts of a Ray cluster (docs/scale.md)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cortex-nb", description="Fine-tune and sample language models from notebooks."
    )
    from .protocol.versions import __version__

    parser.add_argument("--version", action="version", version=f"cortex-nb {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="fine-tune the built-in tiny model on a local backend")
    demo.add_argument("--steps", type=int, default=200)
    demo.add_argument("--lr", type=float, default=3e-3)
    demo.add_argument(
        "--notebook",
        nargs="?",
        metavar="PATH",
        default=None,
        const="cortex-nb-quickstart.ipynb",
        help="instead: run the 01-quickstart notebook headless and write the executed copy at PATH"
        " (default ./cortex-nb-quickstart.ipynb)",
    )
    demo.add_argument(
        "--data-dir",
        default=None,
        help="the local backend's data dir (default: $CORTEX_LOCAL_DIR, else ~/.local/share/cortex-nb/local)",
    )
    run = commands.add_parser("run", help="run your own code on the backend host from a cortex.yaml run spec")
    run.add_argument("spec", help="the run spec (docs/run-spec.md)")
    run.add_argument(
        "--wait", action="store_true", help="follow the logs until the run ends; exit 0 only if it is done"
    )
    run.add_argument(
        "--outputs", metavar="DIR", default=None, help="with --wait: download the outputs (verified) into DIR"
    )
    run.add_argument(
        "--submission-id",
        default=None,
        help="a submission id of your own; submitting it again never runs twice",
    )
    add_backend_choice(run)
    runs = commands.add_parser("runs", help="list recent source runs")
    runs.add_argument("--limit", type=int, default=20)
    add_backend_choice(runs)
    backend = commands.add_parser(
        "backend", help="run or administer the backend service (needs cortex-nb[backend])"
    )
    try:
        from cortex_backend.cli import add_backend_commands
    except ImportError:  # the kernel-side install has no backend
        backend.set_defaults(backend_missing=True)
    else:
        add_backend_commands(backend)
    commands.add_parser(
        "doctor",
        help="what this host gives a backend: bubblewrap (the run sandbox), user namespaces, cgroups, GPUs",
    )
    host = commands.add_parser("host", help="the hosts of a Ray cluster serving one backend (docs/scale.md)")
    host_commands = host.add_subparsers(dest="host_command", required=True)
    join = host_commands.add_parser(
        "join", help="join this machine to the head's Ray cluster (needs cortex-nb[backend,ray])"
    )
    try:
        from cortex_backend.cli import add_host_join_arguments
    except ImportError:
        join.set_defaults(backend_missing=True)
    else:
        add_host_join_arguments(join)
    listing = host_commands.add_parser(
        "list", help="the hosts serving the backend: devices, models, free slots"
    )
    listing.add_argument(
        "--profile",
        default=None,
        help="connection profile (default: CORTEX_URL/CORTEX_TOKEN, then the default profile)",
    )
    return parser


def add_backend_choice(command: argparse.ArgumentParser) -> None:
    """Which backend a command talks to: a profile, CORTEX_URL, or (by default, as in the notebook) this
    user's local backend."""
    command.add_argument(
        "--profile",
        default=None,
        help="connection profile (default: CORTEX_URL/CORTEX_TOKEN, then the default profile, then --local)",
    )
    command.add_argument(
        "--local",
        action="store_true",
        help="use this user's local backend (started if none runs); the default when no URL or profile is set",
    )
    command.add_argument(
        "--data-dir",
        default=None,
        help="with --local: the local backend's data dir (default $CORTEX_LOCAL_DIR)",
    )


def backend_client(args: argparse.Namespace):
    """The client a command uses: `--local`, `--profile NAME`, else CORTEX_URL or the default profile,
    else the per-user local backend (what `%cortex connect --local` reaches)."""
    from . import profiles
    from .client import Client

    if args.local:
        return Client.local(args.data_dir)
    if args.profile is not None or profiles.from_env() is not None or profiles.from_profile(None) is not None:
        return Client.from_profile(args.profile)
    print(
        "using your local backend (no CORTEX_URL or profile set; --profile NAME for another)", file=sys.stderr
    )
    return Client.local(args.data_dir)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        if args.notebook is not None:
            sys.exit(notebook_demo(args))
        from .demo import run_demo

        run_demo(steps=args.steps, learning_rate=args.lr, data_dir=args.data_dir)
        return
    if args.command in ("run", "runs"):
        sys.exit(run_command(args))
    if args.command == "host":
        sys.exit(host_command(args))
    if args.command == "doctor":
        try:
            from cortex_backend.doctor import print_report
        except ImportError:
            print(
                "error: the backend is not installed here; pip install 'cortex-nb[backend]'", file=sys.stderr
            )
            sys.exit(2)
        sys.exit(print_report())
    if args.command == "backend":
        if getattr(args, "backend_missing", False):
            print(
                "error: the backend is not installed here; pip install 'cortex-nb[backend]'", file=sys.stderr
            )
            sys.exit(2)
        from cortex_backend.cli import run_backend_command

        sys.exit(run_backend_command(args))


def host_command(args: argparse.Namespace) -> int:
    """`cortex-nb host join` (runs Ray here) and `cortex-nb host list` (asks the backend)."""
    if args.host_command == "join":
        if getattr(args, "backend_missing", False):
            print(
                "error: joining needs the backend and Ray here: pip install 'cortex-nb[backend,ray]'",
                file=sys.stderr,
            )
            return 2
        from cortex_backend.cli import run_host_join

        return run_host_join(args)
    from .client import Client
    from .errors import CortexError
    from .views import hosts_text

    try:
        with Client.from_profile(args.profile) as client:
            print(hosts_text(client.get_capacity()))
    except CortexError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def notebook_demo(args: argparse.Namespace) -> int:
    """`cortex-nb demo --notebook [PATH]`: 0 when every cell ran, 1 when one failed (named on stderr)."""
    from .demo import run_notebook_demo
    from .errors import CortexError

    try:
        run_notebook_demo(args.notebook, data_dir=args.data_dir)
    except CortexError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if type(exc).__name__ != "CellExecutionError":
            raise
        print(f"error: a cell of the quickstart failed:\n{exc}", file=sys.stderr)
        return 1
    return 0


def run_command(args: argparse.Namespace) -> int:
    """`cortex-nb run` and `cortex-nb runs`."""
    from .errors import CortexError, SubmissionOutcomeUnknown
    from .protocol.states import JOB_DONE, format_bytes

    try:
        with backend_client(args) as client:
            if args.command == "runs":
                frame = client.history(limit=args.limit)
                print(frame.to_string(index=False) if len(frame) else "no runs yet")
                return 0
            handle = client.run(args.spec, submission_id=args.submission_id)
            print(
                f"run {handle.run_id} ({handle.info['name']}) {handle.info['status']}; submission {handle.submission_id}",
                flush=True,
            )
            if not args.wait:
                return 0
            for entry in handle.follow_logs():
                stream = sys.stderr if entry["stream"] == "stderr" else sys.stdout
                print(
                    f"[{entry['stream']}] {entry['line']}" if entry["stream"] == "system" else entry["line"],
                    file=stream,
                    flush=True,
                )
            final = handle.wait()
            report = handle.report()
            print(
                f"run {handle.run_id} {final['status']}"
                + (
                    f" ({final['failure_code']}: {final['failure_message']})"
                    if final.get("failure_code")
                    else ""
                )
                + f"; exit code {report.get('exit_code')}, {report.get('device_seconds')} device-seconds,"
                f" peak memory {format_bytes(report.get('peak_memory_bytes'))}, isolation {report.get('isolation_tier')}"
            )
            if args.outputs and final["status"] == JOB_DONE:
                for name, path in sorted(handle.outputs(dest=args.outputs, keep_paths=True).items()):
                    print(f"output {name}: {path} (verified)")
            return 0 if final["status"] == JOB_DONE else 1
    except SubmissionOutcomeUnknown as exc:
        print(
            f"error: {exc}\nresubmit with --submission-id {exc.submission_id} (it never runs twice)",
            file=sys.stderr,
        )
        return 3
    except CortexError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    main()
