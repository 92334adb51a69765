"""The order of numbered submissions, on its own: each number once, in order, refusals used up."""

from __future__ import annotations

import pytest
from cortex_backend.numbered_submissions import MAX_SEQUENCE_GAP, SequenceStreams

from cortex_nb.protocol.errors import ApiError


def held(request_id: str):
    return ("train", request_id, "step", {}, b"")


def test_early_numbers_wait_and_leave_in_order_past_a_refusal():
    streams = SequenceStreams()
    stream = streams.stream("job-1", ("client", 3))
    assert stream.hold(3, held("req-3")) is True
    assert list(stream.release()) == []
    assert stream.hold(1, held("req-1")) is False
    assert [item[1] for item in stream.release()] == ["req-1"]
    assert stream.use_up(2, ApiError("invalid_field", "bad batch")) is True
    assert [item[1] for item in stream.release()] == ["req-3"]
    assert stream.next_seq == 4


def test_a_retried_number_answers_with_its_request_or_its_refusal():
    stream = SequenceStreams().stream("job-1", ("client", 1))
    stream.hold(1, held("req-1"))
    list(stream.release())
    assert stream.made(1) == "req-1"
    refusal = ApiError("invalid_field", "bad batch")
    assert stream.use_up(2, refusal) is True
    list(stream.release())
    with pytest.raises(ApiError) as caught:
        stream.made(2)
    assert caught.value is refusal
    assert stream.use_up(1, refusal) is False  # made already: a refusal never replaces it
    assert stream.made(3) is None


def test_numbers_out_of_range_are_refused_and_a_job_forgets_its_streams():
    streams = SequenceStreams()
    for bad in (0, -1, True, "1", MAX_SEQUENCE_GAP + 1):
        with pytest.raises(ApiError) as caught:
            streams.stream("job-1", ("client", bad))
        assert caught.value.code == "invalid_field"
    stream = streams.stream("job-1", ("client", 1))
    assert streams.find("job-1", "client") is stream
    streams.forget("job-1")
    assert streams.find("job-1", "client") is None


def test_after_a_restart_a_jobs_streams_go_on_from_the_first_number_they_hear():
    # The numbers sent before the restart went with the old process: a client going on at 41 is not held
    # waiting for 1..40 (client_jobs_resume.py). Other jobs still start at 1.
    streams = SequenceStreams()
    streams.continue_after_restart("job-back")
    stream = streams.stream("job-back", ("client", 41))
    assert stream.next_seq == 41
    assert stream.hold(41, held("req-41")) is False
    assert streams.stream("job-new", ("client", 5)).next_seq == 1
    with pytest.raises(ApiError):  # a number of before the restart, retried after the stream went on
        stream.made(7)
    streams.forget("job-back")
    assert streams.stream("job-back", ("client", 9)).next_seq == 1
