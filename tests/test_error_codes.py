"""One table of error codes (`cortex_nb.protocol.errors.ERROR_CODES`): every code the source can produce
is in it, with a status or a place it appears, and every code in it is produced somewhere."""

from __future__ import annotations

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
