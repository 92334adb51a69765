"""One table of error codes (`cortex_nb.protocol.errors.ERROR_CODES`): every code the source can produce
is in it, with a status or a place it appears, every code in it is produced somewhere, and every code in
it is asserted by some test (tests/test_error_codes_reached.py reaches the ones nothing else does)."""

from __future__ import annotations

import re
from pathlib import Path

from cortex_nb.errors import BackendError, BadRequestError, ConflictError, NotFoundError, error_from_response
from cortex_nb.protocol.errors import (
    CLIENT,
    ERROR_CODES,
    ERROR_STATUS,
    FAILURE_CODES,
    JOB,
    REQUEST,
    RUN,
    status_for,
)

from .error_sources import source_codes


def test_every_code_the_source_produces_is_in_the_table():
    produced = source_codes()
    missing = {code: sorted(files) for code, files in produced.items() if code not in ERROR_CODES}
    assert missing == {}, "add these codes to cortex_nb/protocol/errors.py"


def test_every_code_in_the_table_is_produced_somewhere():
    produced = source_codes()
    assert sorted(set(ERROR_CODES) - set(produced)) == []


# Codes no test can produce on this machine, and why. Each is still produced by the source (above).
NOT_REACHED_BY_TESTS = {
    "internal_error": "a bug in the backend, by definition; the OpenAPI fuzz test fails on any 5xx instead",
    "weight_sync_timeout": "a sync target that stays silent for 600 s (VERDICT_WAIT_S)",
    "sandbox_failed": "the backend failing to set a run up for a reason of its host (a full disk, say)",
}
TESTS = Path(__file__).resolve().parent
NOT_ASSERTIONS = {"error_sources.py", "test_error_codes.py"}  # they name every code without producing one


def test_every_code_in_the_table_is_asserted_by_some_test():
    """A code appears quoted in some test (its assertion), or is listed above with the reason it cannot."""
    texts = [
        path.read_text()
        for path in TESTS.rglob("*.py")
        if path.name not in NOT_ASSERTIONS and "node_modules" not in path.parts
    ]
    unasserted = [
        code
        for code in ERROR_CODES
        if code not in NOT_REACHED_BY_TESTS
        and not any(re.search(rf"[\"']{re.escape(code)}[\"']", text) for text in texts)
    ]
    assert unasserted == [], "assert these codes in a test (tests/test_error_codes_reached.py)"
    assert set(NOT_REACHED_BY_TESTS) <= set(ERROR_CODES)
    still_listed = [code for code in NOT_REACHED_BY_TESTS if any(f'"{code}"' in text for text in texts)]
    assert still_listed == [], "a test asserts these now: drop them from NOT_REACHED_BY_TESTS"


def test_each_code_is_an_http_answer_or_an_ending_and_says_what_it_means():
    for code, entry in ERROR_CODES.items():
        assert entry.code == code
        assert entry.status is not None or entry.ends, code
        assert set(entry.ends) <= {JOB, REQUEST, RUN, CLIENT}, code
        assert entry.meaning and entry.meaning[0].islower(), code
        assert entry.status is None or 400 <= entry.status <= 599, code


def test_statuses_and_client_classes_follow_the_table():
    assert status_for("job_not_found") == 404 and ERROR_STATUS["job_not_found"] == 404
    assert status_for("no_such_code") == 500
    assert "non_finite_gradients" in FAILURE_CODES and "job_not_found" not in FAILURE_CODES
    for code, cls in (
        ("invalid_field", BadRequestError),
        ("job_not_found", NotFoundError),
        ("job_finished", ConflictError),
        ("internal_error", BackendError),
    ):
        error = error_from_response(ERROR_STATUS[code], {"error": {"code": code, "message": "m"}})
        assert isinstance(error, cls) and error.code == code
