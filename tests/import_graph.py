"""The import graph of our packages, read from the source (no module is executed).

Every import counts: one inside a function (a "lazy" import is still a dependency) and one under
`if TYPE_CHECKING:` (a type named in a signature is a dependency between layers too).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "cortex_nb": ROOT / "cortex_nb",
    "cortex_backend": ROOT / "backend" / "cortex_backend",
    "cortex_server": ROOT / "server_extension" / "cortex_server",
}


def module_files() -> dict[str, Path]:
    modules = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _imports(tree: ast.AST) -> list[tuple[int, str | None, list[str]]]:
    """(level, module, names) of every import statement."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((0, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module, [alias.name for alias in node.names]))
    return found


def graph() -> dict[str, set[str]]:
    """module -> the modules of our packages it imports."""
    files = module_files()
    edges: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        package = module if is_package else module.rpartition(".")[0]
        targets = set()
        for level, name, names in _imports(ast.parse(path.read_text(), str(path))):
            if level:
                base = package.split(".")
                base = base[: len(base) - (level - 1)] if level > 1 else base
                absolute = ".".join(base + ([name] if name else []))
            else:
                absolute = name or ""
            submodules = [f"{absolute}.{item}" for item in names if f"{absolute}.{item}" in files]
            targets.update(submodules or ([absolute] if absolute in files else []))
        # A package is always initialised before its modules: an import of an ancestor adds nothing.
        edges[module] = {target for target in targets if not (module + ".").startswith(target + ".")}
    return edges


def cycles(edges: dict[str, set[str]], within: str) -> list[list[str]]:
    """Strongly connected groups of more than one module among modules under `within` (Tarjan)."""
    nodes = [node for node in edges if node == within or node.startswith(within + ".")]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in nodes:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                group.append(item)
                if item == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in nodes:
        if node not in index:
            visit(node)
    return groups
