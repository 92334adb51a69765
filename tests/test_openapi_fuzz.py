"""schemathesis against a live backend on loopback, from its own /v1/openapi.json, with a scoped token:
every operation, stateful links (create a job -> its requests -> its checkpoints); then the Tinker and
Cortex faces, from documents generated from their route tables (tests/face_openapi.py).
Pass: every operation covered, no 5xx, no response outside its documented status codes or schema, no
hung request, and the backend (with a worker it started for a fuzzed job) alive and clean of unhandled
exceptions afterwards. The runs are bounded by examples per operation, not by time, so a slow machine
takes longer instead of failing. `bench/bench_openapi_fuzz.py` runs the same for longer."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from cortex_nb.protocol import routes

from .backend_process import start_backend
from .face_openapi import cortex_document, tinker_document
from .fuzz_report import fuzz
from .tokens import create_token

# Examples per operation (each phase); the time limit is only a backstop against a hung run. One worker:
# with two, CPython 3.11's AST constructor trips over itself across threads inside the fuzzer.
EXAMPLES = int(os.environ.get("CORTEX_FUZZ_EXAMPLES", "5"))
FACE_EXAMPLES = 1
BACKSTOP_S = 400


@pytest.fixture(scope="module")
def fuzzed_backend(tmp_path_factory):
    # A backend of its own: fuzzing creates jobs and uploads no other test should see. Tests run backends
    # with strict replies (conftest.py): a reply field its schema does not declare is a 500 here.
    process = start_backend(
        tmp_path_factory.mktemp("fuzz-backend"), "--devices", "cpu:2", "--worker-threads", "1"
    )
    yield process
    process.stop()


def alive_and_clean(backend, headers: dict[str, str]) -> None:
    assert httpx.get(f"{backend.url}/v1/capacity", headers=headers, timeout=30).status_code == 200
    assert backend.process.poll() is None
    log = backend.log()
    assert "Uncaught exception" not in log and "Exception in callback" not in log, log[-4000:]


@pytest.mark.timeout(BACKSTOP_S + 300)
def test_the_live_backend_answers_as_its_openapi_document_says(fuzzed_backend, tmp_path):
    token = create_token(fuzzed_backend.data_dir, "fuzzer", "jobs:read", "jobs:write", "runs:write")
    report = fuzz(fuzzed_backend.url, token, tmp_path, BACKSTOP_S, max_examples=EXAMPLES)
    summary = (
        f"{report.requests} requests, statuses {dict(report.statuses)}, failures {dict(report.failures)}"
    )
    assert report.server_errors == 0, summary + "\n" + report.output
    assert not report.failures and not report.errors, (
        summary + "\n" + "\n".join(report.errors) + report.output
    )
    assert report.returncode == 0, report.output
    assert len(report.operations) == len(routes.ROUTES), sorted(report.operations)
    alive_and_clean(fuzzed_backend, {"Authorization": f"Bearer {token}"})


@pytest.mark.timeout(2 * BACKSTOP_S + 300)
@pytest.mark.parametrize("face", ["tinker", "cortex"])
def test_the_faces_answer_no_fuzzed_request_with_a_5xx(fuzzed_backend, tmp_path, face):
    document = tinker_document() if face == "tinker" else cortex_document()
    path = tmp_path / f"{face}-openapi.json"
    path.write_text(json.dumps(document))
    token = create_token(
        fuzzed_backend.data_dir, f"{face}-fuzzer", "jobs:read", "jobs:write", tinker=face == "tinker"
    )
    header = "X-API-Key: {token}" if face == "tinker" else "Authorization: Bearer {token}"
    report = fuzz(
        fuzzed_backend.url,
        token,
        tmp_path,
        BACKSTOP_S,
        document=path,
        header=header,
        checks="not_a_server_error",
        max_examples=FACE_EXAMPLES,
        phases="fuzzing",
    )
    summary = f"{face}: {report.requests} requests, statuses {dict(report.statuses)}"
    assert report.server_errors == 0 and not report.failures, summary + "\n" + report.output
    assert not report.errors and report.returncode == 0, summary + "\n".join(report.errors) + report.output
    operations = sum(len(methods) for methods in document["paths"].values())
    assert len(report.operations) == operations, sorted(report.operations)
    alive_and_clean(fuzzed_backend, {"Authorization": f"Bearer {token}"})
