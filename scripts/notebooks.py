"""Keep notebooks/ as git holds them: outputs stripped, except the reference outputs nbval compares.

    python scripts/notebooks.py refresh [NOTEBOOK ...]   # run each headless, keep only reference outputs
    python scripts/notebooks.py strip [NOTEBOOK ...]     # strip without running (references stay)
    python scripts/notebooks.py check                    # exit 1 if a notebook is not clean (a test runs this)

A code cell with a `# NBVAL_CHECK_OUTPUT` line keeps its outputs and execution count: they are what
`pytest --nbval-lax` compares against (after notebooks/nbval-sanitize.cfg). Every other cell is stored
without outputs or execution counts, and no widget state or timing metadata is kept. `refresh` runs each notebook with a
fresh local backend in a temporary folder (CORTEX_LOCAL_DIR) and prints its wall time.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CHECK_MARKER = "NBVAL_CHECK_OUTPUT"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def checked(cell) -> bool:
    """A cell nbval compares: a code cell with a `# NBVAL_CHECK_OUTPUT` comment line."""
    return cell.cell_type == "code" and any(
        line.strip().lstrip("#").strip() == CHECK_MARKER
        for line in cell.source.splitlines()
        if line.strip().startswith("#")
    )


# Paths of the machine a notebook ran on: stored outputs must not carry them (they say nothing to a reader
# and leak the build machine's layout). The sanitized forms are nbval-sanitize.cfg's, so a reference output
# written this way still compares equal with a fresh run's.
MACHINE_PATH = re.compile(
    r"(?<![\w.~])/(?:tmp|home|root|work|Users|private|var/folders|opt|mnt|srv)/[^\s'\"<>]*"
)
STORED_FORMS = (
    (re.compile(r"your local backend in \S+"), "your local backend in DATA_DIR"),
    (re.compile(r"/tmp/[\w./-]+"), "/TMP"),
)


def machine_paths(cell) -> list[str]:
    """Absolute paths of the machine that ran the cell, found in its outputs."""
    found = []
    for output in cell.get("outputs", []):
        texts = [output.get("text", "")] + [
            value for value in (output.get("data") or {}).values() if isinstance(value, str)
        ]
        for text in texts:
            found += MACHINE_PATH.findall(text if isinstance(text, str) else "".join(text))
    return found


def without_machine_paths(text: str) -> str:
    for pattern, replacement in STORED_FORMS:
        text = pattern.sub(replacement, text)
    return text


def strip(notebook) -> None:
    notebook.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("collapsed", None)
        cell.metadata.pop("scrolled", None)
        if cell.cell_type != "code":
            continue
        if not checked(cell):
            cell.outputs = []
            cell.execution_count = None
        for output in cell.outputs:
            if "text" in output:
                output["text"] = without_machine_paths(output["text"])
            for mime, value in (output.get("data") or {}).items():
                if isinstance(value, str):
                    output["data"][mime] = without_machine_paths(value)


def problems(notebook) -> list[str]:
    """What keeps a notebook from being clean, one line each."""
    found = []
    extra = sorted(set(notebook.metadata) - {"kernelspec", "language_info"})
    if extra:
        found.append(f"notebook metadata {extra} (widget state, ...) should be stripped")
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        if checked(cell) and (not cell.outputs or cell.execution_count is None):
            # nbval compares only cells with outputs and an execution count (it skips "unrun" ones).
            found.append(f"cell {index}: marked {CHECK_MARKER} but holds no reference output (run refresh)")
        if not checked(cell) and (cell.outputs or cell.execution_count is not None):
            found.append(
                f"cell {index}: holds outputs or an execution count but is not marked {CHECK_MARKER}"
            )
        if "execution" in cell.metadata:
            found.append(f"cell {index}: timing metadata")
        paths = machine_paths(cell)
        if paths:
            found.append(f"cell {index}: an output holds a path of the machine that ran it: {paths[0]}")
    return found


def targets(names: list[str]) -> list[Path]:
    return [Path(name).resolve() for name in names] if names else sorted(NOTEBOOKS.glob("*.ipynb"))


def refresh(path: Path) -> float:
    sys.path.insert(0, str(ROOT))
    from cortex_nb.headless import execute_notebook, read_notebook

    def show(index: int, cell, seconds: float) -> None:
        print(f"  cell {index:2d}  {seconds:6.1f}s", flush=True)

    with tempfile.TemporaryDirectory(prefix="cortex-nb-refresh-") as scratch:
        print(f"{path.name}:", flush=True)
        started = time.monotonic()
        executed = execute_notebook(
            read_notebook(path),
            path.parent,
            env={"CORTEX_LOCAL_DIR": str(Path(scratch) / "local")},
            on_cell=show,
        )
        elapsed = time.monotonic() - started
    strip(executed)
    write(executed, path)
    print(f"{path.name}: {elapsed:.1f}s")
    return elapsed


def write(notebook, path: Path) -> None:
    import nbformat

    nbformat.validate(notebook)
    path.write_text(nbformat.writes(notebook) + "\n")


def main(argv: list[str] | None = None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("refresh", "strip", "check"))
    parser.add_argument("notebooks", nargs="*")
    args = parser.parse_args(argv)
    paths = targets(args.notebooks)
    if args.command == "refresh":
        total = sum(refresh(path) for path in paths)
        print(f"total {total:.1f}s for {len(paths)} notebook(s)")
        return 0
    failed = False
    for path in paths:
        notebook = nbformat.read(str(path), as_version=4)
        if args.command == "strip":
            strip(notebook)
            write(notebook, path)
            continue
        for problem in problems(notebook):
            failed = True
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            print(f"{shown}: {problem}", file=sys.stderr)
    if failed:
        print("run: python scripts/notebooks.py strip (or refresh)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
