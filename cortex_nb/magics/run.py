"""`%%cortex run` (the cell is `main.py`, run on the backend host as a source run) and `%cortex runs`.

Built on `cortex_nb.runs.run_cell_source` and `cortex_nb.run_outputs`: outputs come back verified by
size and SHA-256, next to the notebook, and are displayed by kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from ..protocol.states import JOB_DONE, JOB_STATES
from .registry import noninteractive, subcommand

if TYPE_CHECKING:
    from . import CortexMagics


def parse_outputs(pairs: list[str] | None) -> dict[str, str]:
    outputs = {}
    for pair in pairs or []:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"cortex run: --output takes NAME=PATH, not {pair!r}")
        outputs[name] = path
    return outputs


@subcommand("run", "cell", "run the cell as main.py on the backend host; outputs come back verified")
@magic_arguments(name="cortex run")
@argument(
    "--include",
    action="append",
    metavar="GLOB",
    help="files beside the notebook to ship with main.py (repeatable)",
)
@argument(
    "--output", action="append", metavar="NAME=PATH", help="a file main.py writes, to bring back (repeatable)"
)
@argument("--gpu", type=int, default=0, help="GPUs the run needs (default 0)")
@argument(
    "--model",
    action="append",
    metavar="NAME",
    help="a registered model staged read-only at models/NAME (repeatable)",
)
@argument(
    "--timeout", type=float, metavar="S", help="seconds before the run is stopped (default from the run spec)"
)
@argument("--name", default="cell", help="a name for the run")
@argument(
    "--isolation",
    choices=("best_effort", "required"),
    default="best_effort",
    help="required: fail rather than run without a network namespace",
)
@argument("--wait", action="store_true", help="block until the run ends (Ctrl-C cancels it)")
@argument(
    "-o",
    "--output-var",
    metavar="VAR",
    help="store the RunHandle in VAR (otherwise it is the cell's result, _)",
)
def run_command(self: CortexMagics, args: Any, cell: str | None):
    """Run the cell's code as main.py on the backend host, as a finite source run (docs/run-spec.md).
    A widget follows its logs; when it ends, the declared outputs are downloaded next to the notebook
    (length and SHA-256 checked) and shown: JSON pretty-printed, CSV as a DataFrame, PNG as an image."""
    from .. import run_spec
    from ..runs import run_cell_source

    if not (cell or "").strip():
        raise UsageError("cortex run: the cell is empty; write the Python code to run")
    client = self.client()
    workdir = Path.cwd()
    handle = run_cell_source(
        client,
        cell,
        includes=args.include or (),
        outputs=parse_outputs(args.output),
        gpu=args.gpu,
        models=args.model or (),
        timeout_s=args.timeout or run_spec.DEFAULT_TIMEOUT_S,
        workdir=workdir,
        name=args.name,
        isolation=args.isolation,
    )
    if noninteractive():
        follow_in_text(handle, workdir)
    else:
        from ..widgets.run_widget import RunWidget

        widget = RunWidget(handle, workdir).show()
        if args.wait:
            try:
                while widget.feed.alive:
                    widget.feed.join(0.25)
            except KeyboardInterrupt:
                handle.cancel()
                print(f"interrupted: run {handle.run_id} was cancelled on the backend")
            widget.throttle.flush()
    if args.output_var:
        self.shell.user_ns[args.output_var] = handle
        return None
    return handle


def follow_in_text(handle: Any, workdir: Path) -> None:
    """Non-interactive: print the run's log lines as they come, a summary, then show its outputs.
    A failed run ends the cell with one line naming its failure code."""
    from ..errors import RunFailed
    from ..run_outputs import fetch_and_display_outputs
    from ..widgets.run_widget import log_line, run_summary

    try:
        for entry in handle.follow_logs():
            print(log_line(entry), flush=True)
    except KeyboardInterrupt:
        handle.cancel()
        print(f"interrupted: run {handle.run_id} was cancelled on the backend")
        return
    info = handle.refresh()
    print(run_summary(info))
    if info["status"] != JOB_DONE:
        raise RunFailed(
            f"run {handle.run_id} {info['status']}: {info.get('failure_message') or ''}".strip(),
            code=info.get("failure_code") or info["status"],
        )
    fetch_and_display_outputs(handle, workdir)


@subcommand("runs", "line", "your source runs, newest first (DataFrame)")
@magic_arguments(name="cortex runs")
@argument("--status", choices=JOB_STATES, help="only runs in this state")
@argument("--limit", type=int, default=20, help="at most this many (default 20)")
def runs_command(self: CortexMagics, args: Any, cell: str | None):
    """Source runs visible to this token, newest first, as a DataFrame."""
    from ..views import runs_frame

    return runs_frame(self.client().list_runs(status=args.status, limit=args.limit))
