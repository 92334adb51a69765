"""`%cortex` / `%%cortex`: the notebook front of cortex-nb.

One magic, many subcommands (`line_commands`, `train`, `sample`, `run`), each parsed by IPython's
`magic_arguments`. Problems print one `UsageError:` line naming what went wrong (no traceback), in
the notebook's words (`error_text`: magics, not REST routes; cell lines of a spec's keys), and
end the cell as failed, so "Run all" stops where the problem is. Blocking calls turn Ctrl-C into a
cancel on the backend.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import parse_argstring

from .. import discovery, errors
from ..train_spec import SpecError
from . import checkpoints, line_commands, run, sample, train  # noqa: F401  (each registers its subcommands)
from .error_text import describe
from .help import overview
from .registry import SUBCOMMANDS, noninteractive

__all__ = [
    "SUBCOMMANDS",
    "CortexMagics",
    "load_ipython_extension",
    "noninteractive",
    "unload_ipython_extension",
]


@magics_class
class CortexMagics(Magics):
    """Holds this kernel's connection; `%cortex` dispatches to the subcommands above."""

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self.connection: discovery.Connection | None = None

    def set_connection(self, connection: discovery.Connection) -> None:
        # The previous client stays open: runs and widgets started through it keep using it.
        self.connection = connection

    def reconnect_hint(self) -> str:
        if self.connection is not None and self.connection.local:
            return "%cortex connect --local starts a new local backend (its jobs are marked as they really ended)"
        return "check that the backend runs, then %cortex connect again"

    def client(self):
        if self.connection is None:
            raise UsageError("not connected: run %cortex connect first (or %cortex connect --local)")
        return self.connection.client

    def local_connection_with(self, job_id: str) -> bool:
        """Not connected yet: connect to this user's running local backend if it holds `job_id` (what
        `%cortex job ID` in a fresh kernel means). Starts no backend; True when connected."""
        from ..local import find_local_backend

        if self.connection is not None or find_local_backend() is None:
            return False
        connection = discovery.connect_local()
        try:
            connection.client.get_job(job_id)
        except errors.CortexError:
            connection.client.close()
            return False
        self.set_connection(connection)
        print(connection.describe())
        return True

    @line_cell_magic
    def cortex(self, line: str, cell: str | None = None):
        name, _, rest = without_comment(line).strip().partition(" ")
        if not name:
            print(overview())
            return None
        command = SUBCOMMANDS.get(name)
        if command is None:
            raise UsageError(
                f"cortex: no subcommand {name!r}; subcommands: {', '.join(SUBCOMMANDS)} (see %cortex?)"
            )
        if command.kind == "cell" and cell is None:
            raise UsageError(
                f"cortex {name} is a cell magic: write %%cortex {name} on the first line of a cell"
            )
        if command.kind == "line" and cell is not None:
            raise UsageError(f"cortex {name} is a line magic: use %cortex {name} (one percent sign)")
        try:
            args = parse_argstring(command.func, rest)
        except UsageError as exc:
            raise UsageError(f"cortex {name}: {exc} (see %cortex help {name})") from None
        try:
            return command.func(self, args, cell)
        except SpecError as exc:
            raise UsageError(f"cortex {name}: {one_line(describe(name, exc, cell))}") from None
        except errors.ConnectionError as exc:
            raise UsageError(
                f"cortex {name}: backend gone: {one_line(exc.message)}; {self.reconnect_hint()}"
            ) from None
        except errors.CortexError as exc:
            raise UsageError(f"cortex {name}: [{exc.code}] {one_line(describe(name, exc, cell))}") from None


def without_comment(line: str) -> str:
    """The magic's line without a trailing `# comment` (as Python code may end), keeping a `#` inside
    quotes or inside a word (`--prompt "issue #3"`, `lr#2`)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line


def one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] + (" …" if len(lines) > 1 else "") if lines else ""


CortexMagics.cortex.__doc__ = overview()


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(CortexMagics)


def unload_ipython_extension(ipython: Any) -> None:
    for kind in ("line", "cell"):
        ipython.magics_manager.magics[kind].pop("cortex", None)
    ipython.magics_manager.registry.pop("CortexMagics", None)
