"""How a magic reports a problem: one line, in the notebook's words.

- A REST route the backend names in a hint ("list yours with GET /v1/jobs") becomes the magic that
  answers the same question ("%cortex jobs"); routes come from `cortex_nb.protocol.routes`, the one table.
- A field of a cell's YAML spec (`lora.r`, or the backend's `sub_jobs[0].lora.target_modules`) is
  named with the cell line it is written on.
"""

from __future__ import annotations

import re
from typing import Any

from ..protocol.routes import route
from ..yaml_lines import key_lines

# route name -> the magic that shows the same thing ({job_id} filled from the hint when it has one)
MAGIC_FOR_ROUTE = {
    "list_jobs": "%cortex jobs",
    "list_runs": "%cortex runs",
    "capacity": "%cortex capacity",
    "list_models": "%cortex models",
    "list_checkpoints": "%cortex checkpoints {job_id}",
}
# Cell magics whose body is a YAML spec: their errors name the cell line of the key.
YAML_CELLS = frozenset({"train"})
# The JSON forms of a train spec's keys: a sub-job's lora/optimizer/base_model, the loop's keys.
_API_PREFIXES = (re.compile(r"^sub_jobs\[\d+\]\."), re.compile(r"^training_loop\."))


def _route_pattern(name: str) -> re.Pattern[str]:
    spec = route(name)
    path = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^\\s/)]+)", re.escape(spec.template))
    return re.compile(re.escape(spec.method) + " " + path + r"(?![\w/{])")


_PATTERNS = {name: _route_pattern(name) for name in MAGIC_FOR_ROUTE}


def in_magic_words(message: str) -> str:
    """Replace each REST route a hint names by the magic that does the same."""
    for name, magic in MAGIC_FOR_ROUTE.items():

        def fill(match: re.Match[str], magic: str = magic) -> str:
            values = {
                key: (value if not value.startswith("{") else key.upper())
                for key, value in match.groupdict().items()
            }
            return magic.format(**values)

        message = _PATTERNS[name].sub(fill, message)
    return message


def spec_key(field: str) -> str:
    """The YAML key of a spec for a field the backend names in its JSON form."""
    for prefix in _API_PREFIXES:
        field = prefix.sub("", field)
    return re.sub(r"^(data|eval\.data)\.dataset_id$", r"\1", field)


def with_cell_line(message: str, field: str | None, cell: str | None) -> str:
    """Name a spec field as the cell writes it, with its line in the cell: "lora.r (line 5): must be >= 1".

    The cell's first line is the `%%cortex ...` line, so the spec's line N is the cell's line N + 1.
    """
    if not field or not cell:
        return message
    name = spec_key(field)
    lines = key_lines(cell)
    written = (
        name  # the deepest key written in the cell: `lora.target_modules[2]` is on `lora.target_modules`
    )
    while written and written not in lines:
        written = re.sub(r"\[\d+\]$", "", written) if written.endswith("]") else written.rpartition(".")[0]
    if not written:
        return message
    where = f"line {lines[written] + 1}"
    for prefix in (field, name):
        if message.startswith(prefix + ":"):
            return f"{name} ({where}){message[len(prefix) :]}"
    return f"{message} ({where})"


def describe(subcommand: str, exc: Any, cell: str | None) -> str:
    """The text of a `CortexError` (or `SpecError`) for a magic's one-line report."""
    field = getattr(exc, "field", None) or (exc.detail or {}).get("field")
    message = with_cell_line(exc.message, field, cell) if subcommand in YAML_CELLS else exc.message
    return in_magic_words(message)
