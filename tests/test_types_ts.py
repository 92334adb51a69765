"""The panel's TypeScript types (labextension/src/types.ts) are generated from the pydantic models' JSON
Schema, the one /v1/openapi.json publishes, and the committed file is what the generator writes now."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic.json_schema import models_json_schema

from cortex_nb.protocol import openapi, routes, typescript
from cortex_nb.protocol.schemas.base import Reply
from cortex_nb.protocol.schemas.server_extension import ExtensionStatus

TYPES_TS = Path(__file__).resolve().parent.parent / "labextension" / "src" / "types.ts"


def test_committed_types_are_what_the_generator_writes():
    assert TYPES_TS.read_text() == typescript.render(), (
        "labextension/src/types.ts is out of date: run python scripts/generate_contract.py"
    )


class Inner(Reply):
    """An inner thing."""

    n: int


class Outer(Reply):
    """First line.

    A second paragraph, with */ inside."""

    kind: Literal["a", "it's"]
    inner: Inner
    maybe: Inner | None
    absent: str | None = None
    sometimes: int = 3
    items: list[Inner]
    counts: dict[str, int]
    anything: dict[str, Any]
    pair: tuple[int, str]
    grid: list[list[float]]
    either: list[int | str]
    described: float = Field(description="in seconds")


def test_json_schema_becomes_interfaces_with_optional_nullable_and_docs_apart():
    _, defs = models_json_schema([(Outer, "serialization")], ref_template=typescript.REF_PREFIX + "{model}")
    schemas = defs["$defs"]
    text = "\n".join(
        line
        for name in typescript.in_dependency_order(["Outer"], schemas)
        for line in typescript.declaration(name, schemas[name])
    )
    assert text == "\n".join(
        [
            "/**",
            " * First line.",
            " *",
            " * A second paragraph, with *\\/ inside.",
            " */",
            "export interface IOuter {",
            "  kind: 'a' | 'it\\'s';",
            "  inner: IInner;",
            "  maybe: IInner | null;",
            "  absent?: string | null;",
            "  sometimes?: number;",
            "  items: IInner[];",
            "  counts: Record<string, number>;",
            "  anything: Record<string, unknown>;",
            "  pair: [number, string];",
            "  grid: number[][];",
            "  either: Array<number | string>;",
            "  /** in seconds */",
            "  described: number;",
            "}",
            "/** An inner thing. */",
            "export interface IInner {",
            "  n: number;",
            "}",
        ]
    )


def interfaces(text: str) -> dict[str, str]:
    return dict(re.findall(r"^export interface (\w+) \{\n(.*?)\n\}", text, re.M | re.S))


def test_every_forwarded_json_reply_and_the_extension_status_have_an_interface():
    declared = interfaces(TYPES_TS.read_text())
    route_replies = dict(re.findall(r"^  (\w+): (I\w+);$", declared["IRouteReplies"], re.M))
    expected = {
        route.name: f"I{route.reply.__name__}"
        for route in routes.ROUTES
        if route.proxied and isinstance(route.reply, type)
    }
    assert route_replies == expected
    schemas = {
        **openapi.build()["components"]["schemas"],
        "ExtensionStatus": ExtensionStatus.model_json_schema(mode="serialization"),
    }
    for name in {*expected.values(), "IExtensionStatus", "IErrorDetail"}:
        assert name in declared, f"types.ts declares no {name}"
        schema = schemas[name.removeprefix("I")]
        fields = dict(re.findall(r"^  (\w+)(\??):", declared[name], re.M))
        assert set(fields) == set(schema["properties"]), name
        always_sent = {field for field, optional in fields.items() if not optional}
        assert always_sent == set(schema.get("required", ())), name
