"""The script gate: a static look at a source run's Python files before it starts (`--run-script-gate`).

Defence in depth on top of the sandbox, never a replacement for it. It reads each `*.py` file of the work
dir with `ast` and reports what the operator's policy forbids (rules below, each may be allowed with
`--run-script-gate-allow RULE`). It sees only what is written literally: code built at run time
(`exec`, `getattr(os, "sys" + "tem")`, `__import__(name)`, a shell command string, a compiled extension, a
script the command downloads or writes) passes unseen. Under `strict` any finding, and any file it cannot
parse, refuses the run (`script_refused`); under `warn` the findings go to the run's log and report.
"""

from __future__ import annotations

import ast
import os
import posixpath
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GATE_MODES = ("strict", "warn", "off")
RULES = {
    "ctypes": "loads native code through ctypes",
    "shell": "runs a shell (os.system, os.popen, or subprocess with shell=True)",
    "network": "uses sockets (a run has no network)",
    "write_outside_workdir": "writes to a literal path outside the work dir",
    "unparsable": "is not Python the gate can parse",
}
# Paths a run may write to by name though they are outside its work dir.
HARMLESS_TARGETS = ("/dev/null", "/dev/stdout", "/dev/stderr")
PATH_WRITES = {"write_text", "write_bytes", "open", "mkdir", "touch"}
SUBPROCESS_CALLS = {"run", "call", "check_call", "check_output", "Popen", "getoutput", "getstatusoutput"}
# A folder the gate does not read: models staged read-only by the backend, not the user's code.
SKIPPED_DIRS = {"models", "__pycache__", ".git"}
MAX_FINDINGS = 200


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    message: str


def scan_workdir(
    workdir: Path, seen_as: Iterable[str] = (), allowed_rules: Iterable[str] = ()
) -> tuple[list[Finding], int]:
    """(findings, files scanned) for every `*.py` file under `workdir`. `seen_as`: other paths the run
    sees its work dir at (inside its sandbox)."""
    roots = [str(workdir), *seen_as]
    findings: list[Finding] = []
    scanned = 0
    for folder, dirs, files in os.walk(workdir):
        dirs[:] = sorted(d for d in dirs if not (folder == str(workdir) and d in SKIPPED_DIRS))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = Path(folder) / name
            if path.is_symlink():
                continue
            scanned += 1
            relative = str(path.relative_to(workdir))
            findings.extend(scan_source(path.read_bytes(), relative, roots))
    allowed = set(allowed_rules)
    return [finding for finding in findings if finding.rule not in allowed][:MAX_FINDINGS], scanned


def scan_source(source: bytes, relative: str, roots: list[str]) -> list[Finding]:
    try:
        tree = ast.parse(source, filename=relative)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None) or 0
        return [
            Finding(
                relative,
                line,
                "unparsable",
                f"cannot parse: {type(exc).__name__}: {exc.msg if isinstance(exc, SyntaxError) else exc}",
            )
        ]
    visitor = _Visitor(relative, roots, posixpath.dirname(relative))
    visitor.visit(tree)
    return visitor.findings


class _Visitor(ast.NodeVisitor):
    def __init__(self, relative: str, roots: list[str], folder: str) -> None:
        self.relative = relative
        self.roots = roots
        self.folder = folder
        self.findings: list[Finding] = []

    def _add(self, node: ast.AST, rule: str, detail: str) -> None:
        self.findings.append(
            Finding(self.relative, getattr(node, "lineno", 0), rule, f"{RULES[rule]}: {detail}")
        )

    # imports ------------------------------------------------------------------------------------
    def _imported(self, node: ast.AST, module: str) -> None:
        top = module.split(".")[0]
        if top in ("ctypes", "_ctypes"):
            self._add(node, "ctypes", f"import {module}")
        elif top in ("socket", "_socket"):
            self._add(node, "network", f"import {module}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._imported(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and not node.level:
            self._imported(node, node.module)
            if node.module == "os" and any(alias.name in ("system", "popen") for alias in node.names):
                self._add(node, "shell", "from os import system/popen")

    # calls --------------------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        if name in ("__import__", "importlib.import_module") and node.args:
            module = _literal_str(node.args[0])
            if module is not None:
                self._imported(node, module)
        if name in ("os.system", "os.popen"):
            self._add(node, "shell", f"{name}(...)")
        elif name and name.split(".")[-1] in SUBPROCESS_CALLS and name.startswith("subprocess."):
            if name.endswith(("getoutput", "getstatusoutput")) or _truthy_keyword(node, "shell"):
                self._add(node, "shell", f"{name}(..., shell=True)")
        elif name == "open" and node.args:
            self._check_write(node, node.args[0], _mode(node, 1))
        elif isinstance(node.func, ast.Attribute) and node.func.attr in PATH_WRITES:
            # Path("/literal").write_text(...) and friends
            target = node.func.value
            if (
                isinstance(target, ast.Call)
                and _dotted(target.func) in ("Path", "pathlib.Path")
                and target.args
            ):
                mode = _mode(node, 0) if node.func.attr == "open" else "w"
                self._check_write(node, target.args[0], mode)
        self.generic_visit(node)

    def _check_write(self, node: ast.Call, path_node: ast.AST, mode: str | None) -> None:
        path = _literal_str(path_node)
        if path is None or mode is None or not any(flag in mode for flag in "wax+"):
            return
        if not self._inside_workdir(path):
            self._add(node, "write_outside_workdir", f"{path!r} opened with mode {mode!r}")

    def _inside_workdir(self, path: str) -> bool:
        if path in HARMLESS_TARGETS:
            return True
        if posixpath.isabs(path):
            clean = posixpath.normpath(path)
            return any(clean == root or clean.startswith(root.rstrip("/") + "/") for root in self.roots)
        # Relative paths resolve against the command's directory, the work dir: they may not climb out.
        return not posixpath.normpath(path).startswith("..")


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _literal_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _truthy_keyword(node: ast.Call, name: str) -> bool:
    for keyword in node.keywords:
        if keyword.arg == name:
            # Anything but a literal false counts: `shell=flag` is a shell the gate cannot rule out.
            return not (isinstance(keyword.value, ast.Constant) and not keyword.value.value)
    return False


def _mode(node: ast.Call, position: int) -> str | None:
    """The literal mode of an open() (`position`: where its mode argument is); "r" when left out; None
    when it is not a literal."""
    for keyword in node.keywords:
        if keyword.arg == "mode":
            return _literal_str(keyword.value)
    if len(node.args) > position:
        return _literal_str(node.args[position])
    return "r"


def gate_report(mode: str, findings: list[Finding], scanned: int, refused: bool) -> dict[str, Any]:
    """What a run's report says of the gate."""
    return {
        "mode": mode,
        "files_scanned": scanned,
        "refused": refused,
        "findings": [asdict(finding) for finding in findings],
    }
