"""The OpenAPI document (GET /v1/openapi.json): generated from the route table and the schemas, every
route in it with its error responses, every error code with a status answered somewhere, and the
rendered reference page current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import pytest

from cortex_nb.protocol import openapi, routes
from cortex_nb.protocol.errors import ERROR_CODES, ApiError, status_for
from cortex_nb.protocol.schemas.base import MAX_SEQ, MAX_WAIT_S, parse
from cortex_nb.protocol.schemas.data_plane import GetRequestQuery
from cortex_nb.protocol.schemas.logs import JobLogsQuery, RunLogsQuery

ROOT = Path(__file__).resolve().parent.parent


def _error_codes(response: dict) -> list[str]:
    error = response["content"]["application/json"]["schema"]["properties"]["error"]
    return error["allOf"][1]["properties"]["code"]["enum"]


def test_every_route_is_an_operation_with_its_error_responses():
    document = openapi.build()
    assert document["openapi"] == "3.1.0"
    operations = {
        op["operationId"]: (path, method.upper(), op)
        for path, methods in document["paths"].items()
        for method, op in methods.items()
    }
    assert sorted(operations) == sorted(route.name for route in routes.ROUTES)
    for route in routes.ROUTES:
        path, method, op = operations[route.name]
        assert (path, method) == (route.template, route.method)
        assert str(route.status) in op["responses"]
        errors = {
            status: _error_codes(response)
            for status, response in op["responses"].items()
            if int(status) >= 400
        }
        assert "500" in errors, route.name
        for status, codes in errors.items():
            assert all(status_for(code) == int(status) for code in codes), (route.name, status, codes)
        listed = {code for codes in errors.values() for code in codes}
        assert set(route.errors) <= listed
        if route.scope is not None:
            assert {"unauthenticated", "forbidden"} <= listed and op["x-scope"] == route.scope
        for name in route.path_params:
            assert any(p["name"] == name and p["in"] == "path" for p in op["parameters"]), (route.name, name)


def test_every_http_error_code_is_answered_by_a_route_or_says_who_answers_it():
    document = openapi.build()
    on_routes = {
        code
        for methods in document["paths"].values()
        for op in methods.values()
        for status, response in op["responses"].items()
        if int(status) >= 400
        for code in _error_codes(response)
    }
    with_status = {code for code, entry in ERROR_CODES.items() if entry.status is not None}
    assert with_status - on_routes == set(openapi.ANSWERED_ELSEWHERE)
    assert on_routes <= with_status
    assert set(document["x-error-codes"]) == set(ERROR_CODES)


def test_component_schemas_are_valid_json_schema():
    document = openapi.build()
    assert {"CreateJob", "JobView", "RequestStatus", "GenerateBody", "ErrorDetail"} <= set(
        document["components"]["schemas"]
    )
    for schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    create_job = document["components"]["schemas"]["CreateJob"]
    assert create_job["additionalProperties"] is False and "sub_jobs" in create_job["required"]


def test_the_spec_formats_and_the_run_manifest_are_described_field_by_field():
    schemas = openapi.build()["components"]["schemas"]

    def properties(name: str) -> set[str]:
        return set(schemas[name]["properties"])

    assert {"steps", "data", "save", "budget_device_s", "retry", "init_from"} <= properties("TrainingLoop")
    assert {"command", "resources", "outputs", "inputs", "retry"} <= properties("RunSpec")
    create_run = schemas["CreateRun"]["properties"]
    assert create_run["manifest"]["items"] == {"$ref": "#/components/schemas/ManifestEntry"}
    entry = schemas["ManifestEntry"]
    assert properties("ManifestEntry") == {"path", "bytes", "sha256", "kind"}
    assert entry["additionalProperties"] is False and entry["properties"]["kind"]["enum"] == [
        "source",
        "input",
    ]


def test_the_backend_serves_the_document_without_a_token(backend):
    response = httpx.get(f"{backend.url}/v1/openapi.json", timeout=30)
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    assert response.json() == openapi.build()


def test_the_rendered_reference_is_up_to_date_and_linked():
    result = subprocess.run(
        [sys.executable, "scripts/generate_api_reference.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    api = (ROOT / "docs" / "api.md").read_text()
    assert "/v1/openapi.json" in api and "(api-reference.md)" in api


def test_cursors_past_what_the_store_holds_are_refused_not_a_500(backend):
    """Found by the fuzzer: a log cursor of 32 digits reached SQLite and overflowed."""
    headers = {"Authorization": f"Bearer {backend.token}"}
    response = httpx.get(f"{backend.url}/v1/events", params={"after": "8" * 32}, headers=headers, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["detail"]["field"] == "after"
    for model in (JobLogsQuery, RunLogsQuery, GetRequestQuery):
        assert parse(model, {"cursor": str(MAX_SEQ)}).cursor == MAX_SEQ
        with pytest.raises(ApiError) as refused:
            parse(model, {"cursor": str(MAX_SEQ + 1)})
        assert refused.value.code == "invalid_field" and refused.value.detail["field"] == "cursor"


def test_every_long_poll_states_how_long_it_is_held():
    """Each `wait` parameter carries the bound the backend holds an answer for, as a keyword and in words."""
    document = openapi.build()
    waits = [
        (op["operationId"], parameter)
        for methods in document["paths"].values()
        for op in methods.values()
        for parameter in op.get("parameters", [])
        if parameter["name"] == "wait"
    ]
    assert len(waits) >= 5, [name for name, _ in waits]
    for name, parameter in waits:
        schema = parameter["schema"]
        assert schema.get("x-maximum-hold") == MAX_WAIT_S and "maximum" not in schema, (name, schema)
        assert f"at most {MAX_WAIT_S:g} s" in (
            parameter.get("description") or schema.get("description", "")
        ), name
