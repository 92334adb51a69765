"""The error and failure codes our source can produce, found by reading it (no code runs).

A code is a string literal in a place that names one: the first argument of `ApiError(...)` or
`OperationError(...)` (or a schema rule's `PydanticCustomError(...)`); a `code=`, `failure_code=` or `error_code=` keyword; a `"code"`, `"failure_code"`
or `"error_code"` key of a dict literal; the code argument of the functions that end jobs, sub-jobs,
requests and runs (`end`, `sub_job_failed`, `_finish`); an `error=(code, message)` tuple; a
`(failed status, code, message)` outcome tuple; a value assigned to a name or attribute called `code`. Where the expression picks between codes
(`a or "x"`, `"x" if ... else "y"`) each literal counts.
"""

from __future__ import annotations

import ast
import re

from .import_graph import PACKAGES

CODE_CALLS = {
    "ApiError": 0,
    "OperationError": 0,
    "CollectionFailure": 0,
    "PydanticCustomError": 0,
    "_field_error": 2,
    "end": 2,
    "sub_job_failed": 2,
    "_finish": 2,
    "InitFailed": 0,  # a worker message (worker_messages.py): its code is the sub-job's failure code
}
CODE_KEYWORDS = {"code", "failure_code", "error_code"}
CODE_KEYS = {"code", "failure_code", "error_code"}
ENDED_STATES = {"JOB_FAILED", "JOB_CANCELLED", "REQUEST_FAILED", "REQUEST_CANCELLED"}
SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


def _literals(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if SNAKE.match(node.value) else []
    if isinstance(node, ast.BoolOp):
        return [text for value in node.values for text in _literals(value)]
    if isinstance(node, ast.IfExp):
        return _literals(node.body) + _literals(node.orelse)
    return []


def _names_code(target: ast.AST) -> bool:
    return (isinstance(target, ast.Name) and target.id == "code") or (
        isinstance(target, ast.Attribute) and target.attr == "code"
    )


def _is_message(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def codes_in(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            position = CODE_CALLS.get(_call_name(node))
            if position is not None and len(node.args) > position:
                found.update(_literals(node.args[position]))
            for keyword in node.keywords:
                if keyword.arg in CODE_KEYWORDS:
                    found.update(_literals(keyword.value))
                elif keyword.arg == "error" and isinstance(keyword.value, ast.Tuple) and keyword.value.elts:
                    found.update(_literals(keyword.value.elts[0]))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value in CODE_KEYS:
                    found.update(_literals(value))
        elif isinstance(node, ast.Assign) and any(_names_code(target) for target in node.targets):
            found.update(_literals(node.value))
        elif isinstance(node, ast.Tuple) and len(node.elts) == 3 and _is_message(node.elts[2]):
            first = node.elts[0]
            if isinstance(first, ast.Name) or (
                isinstance(first, ast.Attribute) and first.attr in ENDED_STATES
            ):
                found.update(_literals(node.elts[1]))
    return found


def source_codes() -> dict[str, set[str]]:
    """code -> the files (relative to the repository) that produce it."""
    root = PACKAGES["cortex_nb"].parent
    where: dict[str, set[str]] = {}
    for folder in PACKAGES.values():
        for path in folder.rglob("*.py"):
            for code in codes_in(ast.parse(path.read_text(), str(path))):
                where.setdefault(code, set()).add(str(path.relative_to(root)))
    return where
