"""The `cortex.yaml` run spec of a source run: one definition, checked by the client (before any upload)
and again by the backend (the authority). docs/run-spec.md describes every field.

A spec that breaks a rule raises `BadRequestError` with code `spec_invalid` and `detail.field` naming
the offending field (dotted: `outputs.metrics.max_bytes`). Unknown keys are refused, never ignored.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from .errors import BadRequestError
from .model_names import is_model_name

SPEC_VERSION = 1
ISOLATION_REQUIRED = "required"
ISOLATION_BEST_EFFORT = "best_effort"
ISOLATION_MODES = (ISOLATION_REQUIRED, ISOLATION_BEST_EFFORT)

MIB = 1024 * 1024
GIB = 1024 * MIB
MAX_INPUT_BYTES = 512 * MIB
MAX_INPUTS = 16
MAX_OUTPUT_BYTES = 128 * MIB
DEFAULT_OUTPUT_BYTES = 8 * MIB
MAX_OUTPUTS_TOTAL_BYTES = 1 * GIB
MAX_OUTPUTS = 32
MAX_SOURCE_FILES = 1000
MAX_SOURCE_BYTES = 64 * MIB
MAX_INCLUDES = 64
MAX_MODELS = 8
MAX_GPUS = 64
MAX_COMMAND_ARGS = 256
DEFAULT_TIMEOUT_S = 3600
MAX_TIMEOUT_S = 7 * 24 * 3600
# Where staged models appear in the work dir; no source file or output may live there.
MODELS_DIR = "models"

# \Z, not $: "$" also matches before a trailing newline.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")

TOP_KEYS = {
    "version",
    "name",
    "source",
    "command",
    "models",
    "inputs",
    "outputs",
    "resources",
    "timeout_seconds",
    "isolation",
}
SOURCE_KEYS = {"include"}
INPUT_KEYS = {"path"}
OUTPUT_KEYS = {"path", "max_bytes", "required"}
RESOURCE_KEYS = {"gpu"}
GPU_KEYS = {"count", "min_vram_gib"}


def spec_error(field: str, message: str) -> BadRequestError:
    return BadRequestError(f"{field}: {message}", code="spec_invalid", status=400, detail={"field": field})


def _mapping(value: Any, field: str, allowed: set[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise spec_error(field, f"must be a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise spec_error(field, f"keys must be strings, got {key!r}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        prefix = f"{field}." if field else ""
        raise spec_error(f"{prefix}{unknown[0]}", f"unknown field; allowed here: {sorted(allowed)}")
    return value


def _integer(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise spec_error(field, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise spec_error(field, f"must be between {low} and {high}, got {value}")
    return value


def _number(value: Any, field: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise spec_error(field, f"must be a number, got {value!r}")
    if not low <= value <= high:
        raise spec_error(field, f"must be between {low:g} and {high:g}, got {value}")
    return value


def relative_path(value: Any, field: str) -> str:
    """A clean relative POSIX path inside the work dir (no '..', no absolute path, not under models/)."""
    if not isinstance(value, str) or not value.strip():
        raise spec_error(field, "must be a non-empty relative path")
    if "\\" in value or "\0" in value or value.startswith("/"):
        raise spec_error(field, f"must be a relative path with '/' separators, got {value!r}")
    normal = posixpath.normpath(value)
    parts = normal.split("/")
    if normal in (".", "") or ".." in parts:
        raise spec_error(field, f"must stay inside the work dir, got {value!r}")
    if parts[0] == MODELS_DIR:
        raise spec_error(field, f"'{MODELS_DIR}/' is where models are staged; choose another path")
    if len(normal) > 512:
        raise spec_error(field, "is longer than 512 characters")
    return normal


def _glob(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise spec_error(field, "must be a non-empty glob pattern")
    if value.startswith("/") or "\\" in value or ".." in value.split("/"):
        raise spec_error(field, f"must be a relative glob inside the spec's folder, got {value!r}")
    return value


def _command(value: Any) -> str | list[str]:
    if isinstance(value, str):
        if not value.strip():
            raise spec_error("command", "must not be empty")
        if "\0" in value:
            raise spec_error("command", "must not contain NUL")
        return value
    if isinstance(value, list) and value:
        if len(value) > MAX_COMMAND_ARGS:
            raise spec_error("command", f"has more than {MAX_COMMAND_ARGS} arguments")
        for index, arg in enumerate(value):
            if not isinstance(arg, str) or "\0" in arg:
                raise spec_error(f"command[{index}]", f"must be a string, got {arg!r}")
        return list(value)
    raise spec_error("command", "must be a string (run by /bin/sh -c) or a non-empty list of arguments")


def validate_spec(raw: Any) -> dict[str, Any]:
    """Check a parsed spec and return it normalised (defaults filled in, paths cleaned)."""
    top = _mapping(raw, "", TOP_KEYS)
    if not top:
        raise spec_error("version", "the spec is empty; it needs at least version, name and command")
    if "version" not in top:
        raise spec_error("version", f"is required; use {SPEC_VERSION}")
    if top["version"] != SPEC_VERSION or isinstance(top["version"], bool):
        raise spec_error("version", f"must be {SPEC_VERSION}, got {top['version']!r}")
    name = top.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise spec_error(
            "name", "is required: 1-64 letters, digits, '_', '.', '-', starting with a letter or digit"
        )
    if "command" not in top:
        raise spec_error("command", "is required, e.g. ['python', 'main.py']")
    spec: dict[str, Any] = {"version": SPEC_VERSION, "name": name, "command": _command(top["command"])}

    source = _mapping(top.get("source"), "source", SOURCE_KEYS)
    includes = source.get("include", [])
    if not isinstance(includes, list):
        raise spec_error("source.include", "must be a list of glob patterns")
    if len(includes) > MAX_INCLUDES:
        raise spec_error("source.include", f"has more than {MAX_INCLUDES} patterns")
    spec["source"] = {"include": [_glob(item, f"source.include[{i}]") for i, item in enumerate(includes)]}

    models = top.get("models", [])
    if not isinstance(models, list):
        raise spec_error("models", "must be a list of registered model names")
    if len(models) > MAX_MODELS:
        raise spec_error("models", f"at most {MAX_MODELS} models")
    for index, model in enumerate(models):
        if not is_model_name(model):
            raise spec_error(
                f"models[{index}]", f"must be the name of a registered model (GET /v1/models), got {model!r}"
            )
        if model in models[:index]:
            raise spec_error(f"models[{index}]", f"{model!r} is listed twice")
    spec["models"] = list(models)

    inputs = _named_entries(top.get("inputs"), "inputs")
    if len(inputs) > MAX_INPUTS:
        raise spec_error("inputs", f"at most {MAX_INPUTS} inputs")
    spec["inputs"] = {}
    for input_name, entry in inputs.items():
        _, path = _path_entry("input", input_name, entry, INPUT_KEYS)
        spec["inputs"][input_name] = {"path": path}
    _no_duplicate_paths(spec["inputs"], "inputs")

    outputs = _named_entries(top.get("outputs"), "outputs")
    if len(outputs) > MAX_OUTPUTS:
        raise spec_error("outputs", f"at most {MAX_OUTPUTS} outputs, got {len(outputs)}")
    spec["outputs"] = {}
    total = 0
    for output_name, entry in outputs.items():
        field = f"outputs.{output_name}"
        entry, path = _path_entry("output", output_name, entry, OUTPUT_KEYS)
        max_bytes = entry.get("max_bytes", DEFAULT_OUTPUT_BYTES)
        _integer(max_bytes, f"{field}.max_bytes", 1, MAX_OUTPUT_BYTES)
        required = entry.get("required", True)
        if not isinstance(required, bool):
            raise spec_error(f"{field}.required", f"must be true or false, got {required!r}")
        total += max_bytes
        spec["outputs"][output_name] = {"path": path, "max_bytes": max_bytes, "required": required}
    if total > MAX_OUTPUTS_TOTAL_BYTES:
        raise spec_error(
            "outputs",
            f"max_bytes add up to {total} bytes; all outputs together may be at most {MAX_OUTPUTS_TOTAL_BYTES}",
        )
    _no_duplicate_paths(spec["outputs"], "outputs")

    resources = _mapping(top.get("resources"), "resources", RESOURCE_KEYS)
    gpu = _mapping(resources.get("gpu"), "resources.gpu", GPU_KEYS)
    spec["resources"] = {
        "gpu": {
            "count": _integer(gpu.get("count", 0), "resources.gpu.count", 0, MAX_GPUS),
            "min_vram_gib": _number(gpu.get("min_vram_gib", 0), "resources.gpu.min_vram_gib", 0, 4096),
        }
    }
    spec["timeout_seconds"] = _number(
        top.get("timeout_seconds", DEFAULT_TIMEOUT_S), "timeout_seconds", 1, MAX_TIMEOUT_S
    )
    isolation = top.get("isolation", ISOLATION_BEST_EFFORT)
    if isolation not in ISOLATION_MODES:
        raise spec_error("isolation", f"must be one of {list(ISOLATION_MODES)}, got {isolation!r}")
    spec["isolation"] = isolation
    return spec


def _named_entries(value: Any, field: str) -> dict[str, Any]:
    """Inputs and outputs are keyed by names the user chooses: any string key is allowed there."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise spec_error(field, f"must be a mapping of name -> entry, got {type(value).__name__}")
    return _mapping(value, field, {key for key in value if isinstance(key, str)})


def _path_entry(kind: str, name: str, entry: Any, allowed: set[str]) -> tuple[dict[str, Any], str]:
    """One input or output: a checked name, then either a bare path or a mapping with a `path`.
    Returns the mapping and its path, made relative and safe."""
    field = f"{kind}s.{name}"
    if not NAME_PATTERN.match(name):
        raise spec_error(field, f"{kind} names are 1-64 letters, digits, '_', '.', '-'")
    if isinstance(entry, str):
        entry = {"path": entry}
    entry = _mapping(entry, field, allowed)
    if "path" not in entry:
        raise spec_error(f"{field}.path", "is required")
    return entry, relative_path(entry["path"], f"{field}.path")


def _no_duplicate_paths(entries: dict[str, dict[str, Any]], field: str) -> None:
    seen: dict[str, str] = {}
    for name, entry in entries.items():
        if entry["path"] in seen:
            raise spec_error(f"{field}.{name}.path", f"is the same path as {field}.{seen[entry['path']]}")
        seen[entry["path"]] = name


def parse_spec_text(text: str) -> dict[str, Any]:
    """Parse YAML (JSON is YAML too) and validate it."""
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadRequestError(
            f"the spec is not valid YAML: {exc}", code="spec_invalid", status=400, detail={"field": ""}
        ) from None
    return validate_spec(raw)
