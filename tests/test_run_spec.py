"""The cortex.yaml job spec: every refusal names the offending field; limits are the documented ones."""

from __future__ import annotations

import pytest

from cortex_nb import run_spec as job_spec
from cortex_nb.errors import BadRequestError

BASE = {"version": 1, "name": "eval", "command": ["python", "main.py"]}


def refusal(spec: dict) -> BadRequestError:
    with pytest.raises(BadRequestError) as caught:
        job_spec.validate_spec(spec)
    assert caught.value.code == "spec_invalid"
    return caught.value


def test_minimal_spec_gets_documented_defaults():
    spec = job_spec.validate_spec(BASE)
    assert spec["timeout_seconds"] == job_spec.DEFAULT_TIMEOUT_S
    assert spec["isolation"] == "best_effort"
    assert spec["resources"] == {"gpu": {"count": 0, "min_vram_gib": 0}}
    assert spec["outputs"] == {} and spec["inputs"] == {} and spec["models"] == []


def test_output_defaults_to_8_mib_and_required():
    spec = job_spec.validate_spec({**BASE, "outputs": {"metrics": {"path": "out/m.json"}}})
    assert spec["outputs"]["metrics"] == {"path": "out/m.json", "max_bytes": 8 * 2**20, "required": True}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({**BASE, "colour": "blue"}, "colour"),
        ({**BASE, "source": {"include": ["*.py"], "exclude": ["x"]}}, "source.exclude"),
        ({**BASE, "outputs": {"m": {"path": "m.json", "compress": True}}}, "outputs.m.compress"),
        ({**BASE, "resources": {"gpu": {"count": 1, "type": "h100"}}}, "resources.gpu.type"),
        ({**BASE, "resources": {"cpu": 4}}, "resources.cpu"),
    ],
)
def test_unknown_keys_are_refused_by_name(spec, field):
    assert refusal(spec).detail["field"] == field


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"name": "x", "command": "true"}, "version"),
        ({**BASE, "version": 2}, "version"),
        ({**BASE, "name": "../etc"}, "name"),
        ({**BASE, "command": []}, "command"),
        ({**BASE, "command": ["python", 3]}, "command[1]"),
        ({**BASE, "timeout_seconds": 0}, "timeout_seconds"),
        ({**BASE, "timeout_seconds": 8 * 24 * 3600}, "timeout_seconds"),
        ({**BASE, "isolation": "strict"}, "isolation"),
        ({**BASE, "resources": {"gpu": {"count": -1}}}, "resources.gpu.count"),
        ({**BASE, "resources": {"gpu": {"count": 1.5}}}, "resources.gpu.count"),
        ({**BASE, "models": ["/etc/passwd"]}, "models[0]"),
        ({**BASE, "models": ["gpt", "gpt"]}, "models[1]"),
        ({**BASE, "source": {"include": ["../secrets/*"]}}, "source.include[0]"),
        ({**BASE, "source": {"include": ["/etc/*"]}}, "source.include[0]"),
        ({**BASE, "inputs": {"data": {"path": "../data.csv"}}}, "inputs.data.path"),
        ({**BASE, "outputs": {"m": {"path": "/tmp/m.json"}}}, "outputs.m.path"),
        ({**BASE, "outputs": {"m": {"path": "models/x.json"}}}, "outputs.m.path"),
        ({**BASE, "outputs": {"m": {"max_bytes": 10}}}, "outputs.m.path"),
        ({**BASE, "outputs": {"m": {"path": "m.json", "required": "yes"}}}, "outputs.m.required"),
        ({**BASE, "outputs": {"a": "x.json", "b": "./x.json"}}, "outputs.b.path"),
    ],
)
def test_bad_values_name_their_field(spec, field):
    error = refusal(spec)
    assert error.detail["field"] == field
    assert error.message.startswith(field)


def test_output_size_limits():
    at_limit = {**BASE, "outputs": {"m": {"path": "m.bin", "max_bytes": 128 * 2**20}}}
    assert job_spec.validate_spec(at_limit)["outputs"]["m"]["max_bytes"] == 128 * 2**20
    over = {**BASE, "outputs": {"m": {"path": "m.bin", "max_bytes": 128 * 2**20 + 1}}}
    assert refusal(over).detail["field"] == "outputs.m.max_bytes"


def test_outputs_total_at_most_1_gib():
    eight = {f"o{i}": {"path": f"o{i}.bin", "max_bytes": 128 * 2**20} for i in range(8)}
    assert len(job_spec.validate_spec({**BASE, "outputs": eight})["outputs"]) == 8
    nine = {**eight, "o8": {"path": "o8.bin", "max_bytes": 1}}
    error = refusal({**BASE, "outputs": nine})
    assert error.detail["field"] == "outputs" and "1073741824" in error.message


def test_at_most_32_outputs():
    many = {f"o{i}": {"path": f"o{i}.txt", "max_bytes": 1024} for i in range(33)}
    assert refusal({**BASE, "outputs": many}).detail["field"] == "outputs"
    assert len(job_spec.validate_spec({**BASE, "outputs": dict(list(many.items())[:32])})["outputs"]) == 32


def test_yaml_text_is_parsed_and_bad_yaml_is_spec_invalid():
    spec = job_spec.parse_spec_text("version: 1\nname: a\ncommand: echo hi\noutputs:\n  log: out.txt\n")
    assert spec["command"] == "echo hi" and spec["outputs"]["log"]["path"] == "out.txt"
    with pytest.raises(BadRequestError) as caught:
        job_spec.parse_spec_text("version: [1\n")
    assert caught.value.code == "spec_invalid"
