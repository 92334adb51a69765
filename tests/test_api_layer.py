"""The kernel side's layers: the route table -> `api.py` (the only layer that builds HTTP) -> the objects
users hold -> the `Client` façade, with no import cycle; and replies checked against their route's model."""

from __future__ import annotations

import ast
import dataclasses
import typing

import pytest
from pydantic import BaseModel

from cortex_nb import Client, ReplyMismatchError, api
from cortex_nb.protocol.routes import ROUTES, route
from cortex_nb.protocol.schemas.base import Reply

from .import_graph import PACKAGES, cycles, graph

# The methods that send a request; only the API layer calls them on a transport.
REQUEST_METHODS = {"request", "json", "download", "stream", "status_of"}
HTTP_LAYER = {"cortex_nb.api", "cortex_nb.transport"}


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return graph()


def test_no_import_cycle_among_cortex_nb_modules(edges):
    # Every import counts, lazy ones and TYPE_CHECKING ones too (tests/import_graph.py).
    assert cycles(edges, "cortex_nb") == []


def test_the_layers_point_one_way(edges):
    for lower in (
        "cortex_nb.api",
        "cortex_nb.transport",
        "cortex_nb.polling",
        "cortex_nb.training",
        "cortex_nb.runs",
    ):
        assert "cortex_nb.client" not in edges[lower], f"{lower} imports the façade above it"
    for module in ("cortex_nb.training", "cortex_nb.runs", "cortex_nb.futures", "cortex_nb.log_stream"):
        assert "cortex_nb.api" in edges[module], f"{module} should call the API layer"


def _calls_on_a_transport(tree: ast.AST) -> list[str]:
    """`<...>.transport.<request method>(...)` calls, and `<...>._transport.<...>(...)`."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if node.func.attr in REQUEST_METHODS and name in ("transport", "_transport"):
            found.append(f"line {node.lineno}: {name}.{node.func.attr}()")
    return found


def test_only_the_api_layer_builds_http_requests():
    offenders = {}
    for path in PACKAGES["cortex_nb"].rglob("*.py"):
        parts = path.relative_to(PACKAGES["cortex_nb"]).with_suffix("").parts
        module = ".".join(("cortex_nb", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        if module in HTTP_LAYER:
            continue
        tree = ast.parse(path.read_text(), str(path))
        imports_httpx = [
            f"line {node.lineno}: imports httpx"
            for node in ast.walk(tree)
            if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "httpx" for a in node.names))
            or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "httpx")
        ]
        problems = imports_httpx + _calls_on_a_transport(tree)
        if problems:
            offenders[module] = problems
    assert offenders == {}


def test_every_route_is_one_api_method_typed_by_its_reply_model():
    for spec in ROUTES:
        method = getattr(api.Api, spec.name, None)
        assert callable(method), f"route {spec.name} has no Api method"
        if isinstance(spec.reply, type) and issubclass(spec.reply, BaseModel):
            returns = typing.get_type_hints(method, include_extras=True)["return"]
            assert getattr(returns, "__metadata__", (None,))[0] is spec.reply, (spec.name, returns)


def test_old_import_paths_still_work():
    from cortex_nb.client import Client as FromClient
    from cortex_nb.client import PollPolicy, RetryPolicy, as_batch

    assert FromClient is Client and PollPolicy().long_poll and RetryPolicy().max_attempts >= 1
    assert as_batch({"input_ids": [[1, 2]]})["input_ids"].dtype.name == "int64"


# replies checked against their models -----------------------------------------------------------------
class CapacityAsAList(Reply):
    """A deliberately wrong model of GET /v1/capacity: its `devices` is a list of objects, not an int."""

    devices: int


class CapacityWithMore(Reply):
    """A deliberately wrong model of GET /v1/capacity: it requires a field the backend never sends."""

    devices: list[dict[str, typing.Any]]
    reactor_temperature: float


def _wrong_model(monkeypatch, name: str, model: type[Reply]) -> None:
    perturbed = dataclasses.replace(route(name), reply=model)
    monkeypatch.setattr(api, "route", lambda asked: perturbed if asked == name else route(asked))


def test_strict_replies_are_on_in_the_tests_and_real_replies_pass(client):
    assert client.api.strict
    # Real replies of the real backend match their real models, field by field.
    assert client.get_capacity()["devices"] and client.list_models() and client.whoami()
    assert isinstance(client.list_jobs(limit=1), list)


def test_a_reply_that_does_not_match_its_schema_raises_a_clear_error_when_strict(client, monkeypatch):
    _wrong_model(monkeypatch, "capacity", CapacityAsAList)
    with pytest.raises(ReplyMismatchError) as mismatch:
        client.get_capacity()
    error = mismatch.value
    assert error.code == "reply_mismatch"
    assert error.detail == {"route": "capacity", "model": "CapacityAsAList", "field": "devices"}
    assert "answer to capacity (GET /v1/capacity) does not match CapacityAsAList: devices:" in str(error)
    assert "same cortex-nb version" in str(error)


def test_by_default_the_check_is_cheap_yet_catches_a_missing_field(backend, monkeypatch):
    monkeypatch.setenv("CORTEX_STRICT_REPLIES", "0")
    with Client(backend.url, backend.token) as client:
        assert not client.api.strict
        # A wrong type passes the cheap check (the full check is the strict one) ...
        _wrong_model(monkeypatch, "capacity", CapacityAsAList)
        assert client.get_capacity()["devices"]
        # ... a required field the reply lacks does not.
        _wrong_model(monkeypatch, "capacity", CapacityWithMore)
        with pytest.raises(ReplyMismatchError) as mismatch:
            client.get_capacity()
        assert mismatch.value.detail["field"] == "reactor_temperature"


def test_check_reply_refuses_what_is_not_an_object():
    spec = route("capacity")
    for strict in (False, True):
        with pytest.raises(ReplyMismatchError):
            api.check_reply(spec, ["not", "an", "object"], strict=strict)
    # Routes whose reply is not JSON of ours (a tar, a frame) are passed through unchecked.
    assert api.check_reply(route("export_checkpoint"), b"tar bytes") == b"tar bytes"
