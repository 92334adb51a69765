"""What `%cortex?` and `%cortex help` show: every subcommand, the train spec keys, each one's options."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from ..train_spec import LORA_KEYS, OPTIMIZER_KEYS, accepted_keys
from .registry import SUBCOMMANDS, Subcommand, subcommand

if TYPE_CHECKING:
    from . import CortexMagics

# The order the overview lists subcommands in: connect first, the cell magics last.
ORDER = (
    "connect",
    "status",
    "capacity",
    "models",
    "jobs",
    "job",
    "logs",
    "cancel",
    "checkpoints",
    "compare",
    "notify",
    "runs",
    "help",
    "train",
    "sample",
    "run",
)


def ordered() -> list[Subcommand]:
    return sorted(SUBCOMMANDS.values(), key=lambda c: ORDER.index(c.name) if c.name in ORDER else len(ORDER))


def overview() -> str:
    """The text `%cortex?` and `%cortex` show: every subcommand, then each one's options."""
    lines = [
        "%cortex SUBCOMMAND [options]      line subcommands",
        "%%cortex train|sample|run [options]  cell subcommands (the cell is the body)",
        "",
    ]
    for kind in ("line", "cell"):
        lines.append("Line subcommands:" if kind == "line" else "Cell subcommands:")
        lines.extend(f"  {c.name:<12} {c.summary}" for c in ordered() if c.kind == kind)
        lines.append("")
    lines.append(train_keys_help())
    lines.append("")
    lines.append(
        "Set CORTEX_NONINTERACTIVE=1 (CI, nbval) to block and print text progress instead of widgets."
    )
    lines.append(
        "Errors print one line. Ctrl-C in a blocking %%cortex sample or run cancels it on the backend;"
    )
    lines.append(
        "in %%cortex train --wait it stops watching (the training goes on: %cortex job ID shows it again)."
    )
    lines.append("")
    lines.append("Options of each subcommand")
    lines.append("--------------------------")
    for command in ordered():
        lines.append((command.func.__doc__ or "").strip())
        lines.append("")
    return "\n".join(lines)


def train_keys_help() -> str:
    keys = accepted_keys()
    rows = [
        ("base_model", "a model name from %cortex models (default tiny)"),
        ("lora", f"{{{', '.join(LORA_KEYS)}}}"),
        ("optimizer", f"{{{', '.join(OPTIMIZER_KEYS)}}} (AdamW; lr default 1e-4)"),
        (
            "data",
            "a JSONL path (rows with text, or prompt + completion) or $variable (list of dicts, DataFrame)",
        ),
        ("batch_size", "rows per step (default 8)"),
        ("max_seq_len", "tokens per row (default 128)"),
        (
            "packing",
            "true: concatenate examples into full rows; false: each example in rows of its own"
            " (default: true for text, false for prompt/completion)",
        ),
        ("steps", "optimizer steps (give steps or epochs)"),
        ("epochs", "passes over the data (give steps or epochs)"),
        ("eval", "{every, data, max_rows}: eval loss on held-out rows every N steps and at the end"),
        ("sample", "{every, prompts, max_tokens, temperature}: greedy samples every N steps and at the end"),
        (
            "save",
            "{every, type}: a checkpoint step-N every N steps (type resumable|weights-only); the end is"
            " always saved as checkpoint final",
        ),
        ("seed", "shuffling and LoRA init seed (default 0)"),
        (
            "keep_alive",
            "how long the job stays up for sampling after training (e.g. 10m; default 0: it"
            " completes, freeing its device)",
        ),
        (
            "retry",
            "{max, on, backoff_s}: retry a failed attempt (worker_crashed, host_lost, oom) from the"
            " newest resumable checkpoint",
        ),
        (
            "budget",
            "device-seconds the run may use (e.g. 10m); spent, it stops and saves checkpoint final"
            " (%cortex usage shows what was used)",
        ),
    ]
    text = ["%%cortex train spec keys (YAML; unknown keys are refused):"]
    text.extend(f"  {key:<12} {meaning}" for key, meaning in rows if key in keys)
    if "save" not in keys:
        text.append("  (save: arrives with checkpoints in the SDK)")
    return "\n".join(text)


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
