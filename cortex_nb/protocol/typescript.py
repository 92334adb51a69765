"""The JSON shapes the sidebar panel reads, as TypeScript declarations (labextension/src/types.ts).

They are read from the JSON Schema that `GET /v1/openapi.json` publishes (`openapi.build()`): every
JSON reply of a route the Jupyter proxy forwards, the error body, and the server extension's own status
report (`schemas.server_extension`). Each schema becomes `export interface I<Name>`, named after its
pydantic class; its docstring and field descriptions become TSDoc. A field the schema requires is always
sent; one it does not (a field with a default: replies leave out what the service did not set) may be
absent (`name?:`); `null` appears only where the schema allows it. `IRouteReplies` maps each forwarded
route's name to its reply, so the panel names a route and gets its type.

`scripts/generate_contract.py` writes the file; tests/test_types_ts.py keeps it current.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from . import openapi
from .routes import ROUTES, Route
from .schemas.base import ErrorDetail
from .schemas.server_extension import ExtensionStatus

REF_PREFIX = "#/components/schemas/"
_IDENTIFIER = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")


def interface_name(schema_name: str) -> str:
    """`JobView` -> `IJobView`: the TypeScript name of a schema (JupyterLab names interfaces `I...`)."""
    return "I" + re.sub(r"[^A-Za-z0-9_]", "_", schema_name)


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return json.dumps(value)


def _union(members: Iterable[str]) -> str:
    unique = list(dict.fromkeys(members))
    if "unknown" in unique:
        return "unknown"
    return " | ".join(unique) if unique else "never"


def _array(item: str) -> str:
    return f"{item}[]" if re.fullmatch(r"[\w.'\[\]]+", item) else f"Array<{item}>"


def ts_type(schema: Mapping[str, Any] | bool) -> str:
    """The TypeScript type of one JSON Schema (a property's, an array's items, ...)."""
    if schema is True or schema == {}:
        return "unknown"
    if schema is False:
        return "never"
    assert isinstance(schema, Mapping)
    if "$ref" in schema:
        return interface_name(schema["$ref"].rsplit("/", 1)[-1])
    if "const" in schema:
        return _literal(schema["const"])
    if "enum" in schema:
        return _union(_literal(value) for value in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _union(ts_type(member) for member in schema[key])
    if "allOf" in schema:
        parts = list(dict.fromkeys(ts_type(member) for member in schema["allOf"]))
        return " & ".join(f"({part})" if " | " in part else part for part in parts)
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union(ts_type({**schema, "type": one}) for one in kind)
    if kind in ("integer", "number"):
        return "number"
    if kind in ("string", "boolean", "null"):
        return kind
    if kind == "array":
        if "prefixItems" in schema:
            items = [ts_type(item) for item in schema["prefixItems"]]
            rest = schema.get("items")
            if rest not in (None, False):
                items.append(f"...{_array(ts_type(rest))}")
            return "[" + ", ".join(items) + "]"
        return _array(ts_type(schema.get("items", True)))
    if kind == "object" or "properties" in schema:
        return _object(schema)
    return "unknown"


def _object(schema: Mapping[str, Any]) -> str:
    """An object schema without a name: an inline type literal, or a `Record` of its values."""
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties", True)
    values = [ts_type(extra)] + [ts_type(value) for value in (schema.get("patternProperties") or {}).values()]
    if not properties:
        return f"Record<string, {_union(values)}>"
    required = set(schema.get("required", ()))
    fields = "; ".join(
        f"{_key(name)}{'' if name in required else '?'}: {ts_type(value)}"
        for name, value in properties.items()
    )
    return "{ " + fields + " }"


def _key(name: str) -> str:
    return name if _IDENTIFIER.match(name) else _literal(name)


def _doc(text: str | None, indent: str) -> list[str]:
    """TSDoc for a docstring or description (kept as written; `*/` cannot end it early)."""
    if not text:
        return []
    lines = text.replace("*/", "*\\/").strip().splitlines()
    if len(lines) == 1:
        return [f"{indent}/** {lines[0]} */"]
    return [f"{indent}/**", *(f"{indent} * {line}".rstrip() for line in lines), f"{indent} */"]


def declaration(name: str, schema: Mapping[str, Any]) -> list[str]:
    """`export interface I<name> {...}` for an object schema, else `export type I<name> = ...`."""
    lines = _doc(schema.get("description"), "")
    properties = schema.get("properties")
    if schema.get("type") != "object" or properties is None:
        return [*lines, f"export type {interface_name(name)} = {ts_type(schema)};"]
    required = set(schema.get("required", ()))
    lines.append(f"export interface {interface_name(name)} {{")
    for field, value in properties.items():
        lines += _doc(value.get("description"), "  ")
        optional = "" if field in required else "?"
        lines.append(f"  {_key(field)}{optional}: {ts_type(value)};")
    extra = schema.get("additionalProperties")
    if extra not in (None, False):
        lines.append(f"  [key: string]: {ts_type(extra)};")
    lines.append("}")
    return lines


def _refs(schema: Any) -> list[str]:
    """The schema names `schema` refers to, in the order they appear."""
    if isinstance(schema, Mapping):
        found = [schema["$ref"].rsplit("/", 1)[-1]] if "$ref" in schema else []
        for value in schema.values():
            found += _refs(value)
        return found
    if isinstance(schema, list):
        return [name for value in schema for name in _refs(value)]
    return []


def in_dependency_order(roots: Iterable[str], defs: Mapping[str, Any]) -> list[str]:
    """`roots` and every schema they refer to, each once: a schema first, then what it refers to."""
    ordered: dict[str, None] = {}

    def visit(name: str) -> None:
        if name in ordered:
            return
        if name not in defs:
            raise KeyError(f"schema {name!r} is referred to but not defined")
        ordered[name] = None
        for ref in _refs(defs[name]):
            visit(ref)

    for root in roots:
        visit(root)
    return list(ordered)


def _schema_name(route: Route) -> str | None:
    reply = route.reply
    return reply.__name__ if isinstance(reply, type) and issubclass(reply, BaseModel) else None


def panel_schemas() -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """The schemas the panel can meet, in the order types.ts declares them, and each forwarded route's
    reply schema by route name."""
    defs = dict(openapi.build()["components"]["schemas"])
    own = [ExtensionStatus]
    _, extension = models_json_schema(
        [(model, "serialization") for model in own], ref_template=REF_PREFIX + "{model}"
    )
    for name, schema in extension.get("$defs", {}).items():
        if name in defs and defs[name] != schema:
            raise ValueError(
                f"schema {name!r} differs between the backend's and the server extension's replies"
            )
        defs[name] = schema
    replies = {route.name: name for route in ROUTES if route.proxied and (name := _schema_name(route))}
    roots = [ErrorDetail.__name__, *(model.__name__ for model in own), *replies.values()]
    return defs, in_dependency_order(roots, defs), replies


def render() -> str:
    """The text of labextension/src/types.ts."""
    defs, order, replies = panel_schemas()
    lines = [
        "// Generated by scripts/generate_contract.py from the JSON Schema of cortex_nb/protocol/schemas/",
        "// (the replies of GET /v1/openapi.json and the server extension's status report).",
        "// Do not edit: change the pydantic models and run `python scripts/generate_contract.py`.",
    ]
    for name in order:
        lines += ["", *declaration(name, defs[name])]
    lines += [
        "",
        "/** What each backend route the Jupyter server extension forwards answers with (JSON replies only). */",
        "export interface IRouteReplies {",
        *(f"  {route}: {interface_name(name)};" for route, name in replies.items()),
        "}",
        "",
        "/** The name of a forwarded backend route that answers with JSON. */",
        "export type JsonRouteName = keyof IRouteReplies;",
        "",
    ]
    return "\n".join(lines)
