"""The API as an OpenAPI 3.1 document, generated from the route table and the schemas.

Every route is an operation (its `operationId` is the route's name) with its path and query parameters,
its body, its success reply and one response per error status, each listing the codes the route can
answer with (the error table in `errors.py` says what each means). The backend serves the document at
`GET /v1/openapi.json`; docs/api-reference.md is rendered from it; schemathesis tests the live backend
against it.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from . import routes as routes_module
from .errors import ERROR_CODES, status_for
from .routes import Content, Route
from .schemas.base import IDENTIFIER, SHA256_HEX, ErrorDetail, ErrorReply
from .versions import API_VERSION, __version__

REF = "#/components/schemas/{model}"
BODY_ERRORS = ("invalid_json", "invalid_field", "body_too_large")
AUTH_ERRORS = ("unauthenticated", "forbidden")
# Any route may fail unexpectedly, be refused when the backend has all the connections it allows, or meet
# a store that refuses writes (a full disk, a database lock another process holds); the answer is still the
# error body.
EVERY_ROUTE_ERRORS = ("internal_error", "too_many_connections", "storage_unavailable", "insufficient_storage")
# Codes with an HTTP status that no route of this document answers with, and who answers with them.
ANSWERED_ELSEWHERE = {
    "route_not_found": "the backend, for a path no route has",
    "method_not_allowed": "the backend, for a route's path with a method it does not take",
    "route_not_proxied": "the Jupyter proxy (server_extension)",
    "proxy_not_configured": "the Jupyter proxy (server_extension)",
    "backend_unavailable": "the Jupyter proxy (server_extension)",
    "version_mismatch": "the client, for a backend of another API major",
    "not_supported": "the Cortex SDK face (docs/cortex-sdk.md), on its own routes",
    "chunk_group_restart_required": "the Cortex SDK face's chunk groups",
    "chunk_group_conflict": "the Cortex SDK face's chunk groups",
    "chunk_group_missing_chunks": "the Cortex SDK face's chunk groups",
    "session_not_found": "the Tinker face (docs/tinker.md), on its own routes under /api/v1",
    "model_not_found": "the Tinker face (docs/tinker.md), on its own routes under /api/v1",
    "session_expired": "the Tinker face (docs/tinker.md), on its own routes under /api/v1",
    "too_many_sessions": "the Tinker face (docs/tinker.md), on its own routes under /api/v1",
    "download_link_invalid": "the Tinker face (docs/tinker.md), for a signed URL (external weights, a session trace)",
    "custom_loss_refused": "the Tinker face (docs/tinker.md), for a custom loss graph outside its allow-list",
}
# Path parameters the backend checks before looking anything up; the others are any one segment.
PATH_SCHEMAS: dict[str, dict[str, Any]] = {
    "index": {"type": "integer", "minimum": 0},
    "dataset_id": {"type": "string", "pattern": SHA256_HEX},
    "upload_id": {"type": "string", "pattern": IDENTIFIER},
}


def error_codes(route: Route) -> list[str]:
    """Every code `route` can answer with: its own, plus those of its kind (auth, a JSON body, a query)."""
    codes = list(route.errors)
    if route.scope is not None:
        codes += AUTH_ERRORS
    if isinstance(route.body, type):
        codes += BODY_ERRORS
    elif isinstance(route.body, Content):
        codes += ("body_too_large",)
    if route.query is not None:
        codes.append("invalid_field")
    codes += EVERY_ROUTE_ERRORS
    return sorted(set(codes))


def _models(table: tuple[Route, ...]) -> list[tuple[type[BaseModel], str]]:
    pairs: dict[tuple[type[BaseModel], str], None] = {(ErrorReply, "serialization"): None}
    for route in table:
        if isinstance(route.body, type):
            pairs[(route.body, "validation")] = None
        if isinstance(route.reply, type):
            pairs[(route.reply, "serialization")] = None
    return list(pairs)


# One server-sent event, as OpenAPI 3.2 describes a stream's items (`itemSchema`): its name and its data line.
SERVER_SENT_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer", "minimum": 0},
    },
}


def _content(content: Content) -> dict[str, Any]:
    if content.media_type == "text/event-stream":
        return {content.media_type: {"itemSchema": SERVER_SENT_EVENT}}
    schema = (
        {"type": "string"}
        if content.media_type.startswith(("text/", "application/x-ndjson"))
        else {"type": "string", "format": "binary"}
    )
    return {content.media_type: {"schema": schema}}


def _error_response(codes: list[str], refs: dict[Any, dict[str, str]]) -> dict[str, Any]:
    detail = (
        refs[(ErrorDetail, "serialization")]["$ref"]
        if (ErrorDetail, "serialization") in refs
        else "#/components/schemas/ErrorDetail"
    )
    schema = {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"allOf": [{"$ref": detail}, {"properties": {"code": {"enum": codes}}}]}},
    }
    meanings = "; ".join(f"`{code}`: {ERROR_CODES[code].meaning}" for code in codes)
    return {"description": meanings, "content": {"application/json": {"schema": schema}}}


def _parameters(route: Route) -> list[dict[str, Any]]:
    parameters = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": dict(PATH_SCHEMAS.get(name, {"type": "string"})),
        }
        for name in route.path_params
    ]
    if route.query is not None:
        schema = route.query.model_json_schema(mode="validation")
        required = set(schema.get("required", ()))
        for name, prop in schema["properties"].items():
            prop = dict(prop)
            description = prop.pop("description", None)
            prop.pop("title", None)
            parameter = {"name": name, "in": "query", "required": name in required, "schema": prop}
            if description:
                parameter["description"] = description
            parameters.append(parameter)
    return parameters


def operation(route: Route, refs: dict[Any, dict[str, str]]) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": route.name,
        "summary": route.summary or route.name,
        "tags": [route.template.split("/")[2] if route.template.startswith("/v1/") else "meta"],
    }
    parameters = _parameters(route)
    if parameters:
        op["parameters"] = parameters
    if isinstance(route.body, type):
        required = bool(route.body.model_json_schema(mode="validation").get("required"))
        op["requestBody"] = {
            "required": required,
            "content": {"application/json": {"schema": refs[(route.body, "validation")]}},
        }
    elif isinstance(route.body, Content):
        op["requestBody"] = {
            "required": not route.body.optional,
            "description": route.body.description,
            "content": _content(route.body),
        }
    success: dict[str, Any] = {"description": route.summary or "success"}
    if isinstance(route.reply, type):
        success["content"] = {"application/json": {"schema": refs[(route.reply, "serialization")]}}
    elif isinstance(route.reply, Content):
        success["description"] = route.reply.description
        success["content"] = _content(route.reply)
    if route.stream is not None:
        success["content"] = {**success.get("content", {}), **_content(route.stream)}
    if route.links:
        success["links"] = {
            target: {"operationId": target, "parameters": parameters} for target, parameters in route.links
        }
    responses: dict[str, Any] = {str(route.status): success}
    by_status: dict[int, list[str]] = {}
    for code in error_codes(route):
        by_status.setdefault(status_for(code), []).append(code)
    for status, codes in sorted(by_status.items()):
        responses[str(status)] = _error_response(codes, refs)
    op["responses"] = responses
    if route.scope is not None:
        op["security"] = [{"bearer": []}]
        op["x-scope"] = route.scope
    op["x-proxied"] = route.proxied
    return op


def build(table: tuple[Route, ...] | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `table` (default: every route)."""
    table = table if table is not None else routes_module.ROUTES
    refs, defs = models_json_schema(_models(table), ref_template=REF)
    paths: dict[str, dict[str, Any]] = {}
    for route in table:
        paths.setdefault(route.template, {})[route.method.lower()] = operation(route, refs)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "cortex-nb backend",
            "version": API_VERSION,
            "x-package-version": __version__,
            "description": "Fine-tune and sample language models on GPUs. Errors are always "
            '`{"error": {"code", "message", "detail"}}` with a stable code (x-error-codes).',
        },
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a backend token (scopes: jobs:read, jobs:write, runs:write, admin)",
                }
            },
        },
        "x-error-codes": {
            code: {
                "status": entry.status,
                "meaning": entry.meaning,
                "ends": list(entry.ends),
                **({"answered_by": ANSWERED_ELSEWHERE[code]} if code in ANSWERED_ELSEWHERE else {}),
            }
            for code, entry in ERROR_CODES.items()
        },
    }


@functools.cache
def document_json() -> bytes:
    """The served document, built once per process."""
    import json

    return json.dumps(build(), sort_keys=True).encode()
