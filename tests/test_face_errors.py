"""The error table's category column, and the faces' classifications derived from it: a code is
classified once, in cortex_nb/protocol/errors.py, and every face follows."""

from __future__ import annotations

import pytest
from cortex_backend.compat.face_errors import cortex_status, tinker_category, tinker_status

from cortex_nb.protocol import errors
from cortex_nb.protocol.errors import CATEGORIES, ERROR_CODES, ErrorCode, category_of


def test_every_code_has_a_category_and_a_code_without_a_status_must_name_one():
    assert {entry.category for entry in ERROR_CODES.values()} == set(CATEGORIES)
    with pytest.raises(ValueError, match="give its category"):
        ErrorCode("made_up_failure", None, "a failure with no HTTP answer")
    with pytest.raises(ValueError, match="unknown category"):
        ErrorCode("made_up_error", 400, "wrong", category="maybe")
    assert ErrorCode("made_up_error", 503, "busy").category == errors.RETRYABLE
    assert ErrorCode("made_up_error", 501, "absent").category == errors.NOT_SUPPORTED
    assert category_of("no_such_code") == errors.INTERNAL and category_of(None) == errors.INTERNAL


def test_the_clients_retryable_codes_are_the_tables_retryable_category():
    assert {
        "backend_restarted",
        "backend_draining",
        "rate_limited",
        "worker_crashed",
    } <= errors.RETRYABLE_CODES
    assert errors.ApiError("backend_draining", "stopping").retryable
    assert not errors.ApiError("invalid_batch", "bad").retryable


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("invalid_batch", "user"),
        ("job_finished", "user"),
        ("not_supported", "user"),
        ("unsupported_operation", "user"),
        ("non_finite_gradients", "user"),
        ("worker_crashed", "server"),
        ("backend_draining", "server"),
        ("operation_failed", "server"),
        (None, "server"),
    ],
)
def test_tinker_failed_futures_say_user_only_where_retrying_cannot_help(code, expected):
    assert tinker_category(code) == expected


def test_tinker_and_cortex_statuses_never_let_the_sdk_retry_a_final_refusal():
    assert tinker_status("checkpoint_exists", 409) == 400
    assert tinker_status("checkpoint_in_use", 409) == 409  # retryable: the SDK's own retry is right
    assert tinker_status("rate_limited", 429) == 429
    assert cortex_status("not_supported", 501) == 501
    assert cortex_status("job_finished", 409) == 410
    assert cortex_status("job_not_found", 404) == 400
    assert cortex_status("conflict", 409) == 422
    assert cortex_status("checkpoint_in_use", 409) == 409
    assert cortex_status("chunk_group_conflict", 409) == 409
    assert cortex_status("backend_draining", 503) == 503
    assert cortex_status("isolation_unsupported", 400) == 501


def test_a_code_added_to_the_table_alone_is_classified_on_both_faces(monkeypatch):
    monkeypatch.setitem(ERROR_CODES, "made_up_refusal", ErrorCode("made_up_refusal", 409, "refused for good"))
    monkeypatch.setitem(
        ERROR_CODES,
        "made_up_wait",
        ErrorCode("made_up_wait", 409, "busy for a moment", category=errors.RETRYABLE),
    )
    assert tinker_category("made_up_refusal") == "user" and tinker_status("made_up_refusal", 409) == 400
    assert cortex_status("made_up_refusal", 409) == 422
    assert tinker_category("made_up_wait") == "server" and tinker_status("made_up_wait", 409) == 409
    assert cortex_status("made_up_wait", 409) == 409
