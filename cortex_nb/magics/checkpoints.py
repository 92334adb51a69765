"""`%cortex checkpoints`: a job's lineage (step → checkpoint → exports, loads, samplings) with bytes, or,
with no job, the storage every job's checkpoints take against the quota; and the bulk actions: keep a
checkpoint, delete all but `final` and the kept ones, or only those older than a duration."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from ..api import api_of
from ..protocol.states import format_bytes
from .registry import checkpoints_supported, subcommand

if TYPE_CHECKING:
    from . import CortexMagics

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(value: str) -> float:
    """Seconds from `90`, `90s`, `30m`, `12h`, `7d`."""
    match = _AGE.match(value)
    if match is None:
        raise UsageError(f"--older-than {value!r} is not a duration: write e.g. 90s, 30m, 12h or 7d")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


@subcommand(
    "checkpoints",
    "line",
    "a job's checkpoints and where they went, or storage per job; keep, prune",
    available=checkpoints_supported,
)
@magic_arguments(name="cortex checkpoints")
@argument("job_id", nargs="?", help="a job (default: every job's storage against the quota)")
@argument("--keep", metavar="CHECKPOINT", help="mark a checkpoint keep: no bulk delete removes it")
@argument("--unkeep", metavar="CHECKPOINT", help="take a checkpoint's keep mark off")
@argument("--prune", action="store_true", help="delete the job's checkpoints but `final` and the kept ones")
@argument("--older-than", metavar="AGE", help="with --prune: only those older than AGE (90s, 30m, 12h, 7d)")
@argument("--dry-run", action="store_true", help="with --prune: say what would go, delete nothing")
def checkpoints_command(self: CortexMagics, args: Any, cell: str | None):
    """A job's checkpoints as a DataFrame, one row per checkpoint with its step, bytes, keep mark and where
    its weights went; with no job, one row per job holding checkpoints, with the storage meter printed."""
    api = api_of(self.client())
    if args.job_id is None:
        if args.keep or args.unkeep or args.prune:
            raise UsageError(
                "--keep, --unkeep and --prune act on one job: %cortex checkpoints JOB_ID --prune"
            )
        from ..views import storage_frame

        frame = storage_frame(api.storage())
        for line in frame.attrs["meters"]:
            print(line)
        return frame
    if (args.older_than or args.dry_run) and not args.prune:
        raise UsageError("--older-than and --dry-run go with --prune")
    for checkpoint_id, kept in ((args.keep, True), (args.unkeep, False)):
        if checkpoint_id:
            api.keep_checkpoint(args.job_id, checkpoint_id, kept)
            print(f"{checkpoint_id}: {'kept' if kept else 'no longer kept'}")
    if args.prune:
        older = parse_age(args.older_than) if args.older_than else None
        pruned = api.prune_checkpoints(args.job_id, older_than_s=older, dry_run=args.dry_run)
        verb = "would delete" if pruned["dry_run"] else "deleted"
        spared = ", ".join(f"{s['checkpoint_id']} ({s['reason']})" for s in pruned["spared"]) or "none"
        print(
            f"{verb} {len(pruned['deleted'])} checkpoint(s), {format_bytes(pruned['freed_bytes'])}:"
            f" {', '.join(pruned['deleted']) or 'none'}; spared: {spared}"
        )
    from ..views import lineage_frame

    frame = lineage_frame(api.job_lineage(args.job_id))
    attrs = frame.attrs
    print(
        f"{attrs['name'] or attrs['job_id']}: step {attrs['step'] if attrs['step'] is not None else '–'},"
        f" {len(frame)} checkpoint(s), {attrs['size']}, {attrs['weight_syncs']} weight sync(s)"
    )
    if attrs["origins"]:
        print(f"weights came from: {attrs['origins']}")
    return frame
