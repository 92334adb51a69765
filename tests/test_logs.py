"""Job logs: every line once and in order, through cursor pages and through a follow stream whose
connection is cut mid-way; bounded retention that says what it dropped; downloads."""

from __future__ import annotations

import re
import threading
import warnings

import httpx
import pytest

from cortex_nb import Client, NotFoundError
from cortex_nb.protocol.states import JOB_DONE

from .backend_process import start_backend
from .tcp_relay import TcpRelay
from .tokens import create_token

FORWARD_BACKWARD_LINE = re.compile(r"^\[engine\] forward_backward=(\d+) summed_loss=\S+ tokens=2 ")
BATCH = {"input_ids": [[1, 2]], "target_tokens": [[2, 3]], "weights": [[1.0, 1.0]]}


def forward_backward_numbers(lines: list[dict]) -> list[int]:
    return [int(match.group(1)) for line in lines if (match := FORWARD_BACKWARD_LINE.match(line["line"]))]


def assert_contiguous(lines: list[dict]) -> None:
    """Sequence numbers strictly increase by one: no duplicate, no gap, no reordering."""
    seqs = [line["seq"] for line in lines]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "sequence numbers are not contiguous"


def page_all(client: Client, job_id: str, limit: int) -> list[dict]:
    lines, cursor = [], 0
    while True:
        page = client.tail_logs(job_id, cursor, limit)
        assert page["dropped"] == 0
        if not page["lines"]:
            return lines
        lines.extend(page["lines"])
        cursor = page["cursor"]


@pytest.mark.slow
def test_five_thousand_lines_arrive_once_in_order_by_pages_and_by_a_cut_and_resumed_stream(backend, client):
    total = 5000
    # The registered small GPT-2 with LoRA on one module: the cheapest real forward_backward there is.
    job = client.create_training_job("small-gpt2", lora={"r": 1, "target_modules": ["c_attn"]})
    relay = TcpRelay("127.0.0.1", int(backend.url.rsplit(":", 1)[1]))
    followed: list[dict] = []
    failure: list[BaseException] = []

    with Client(relay.url, backend.token) as follower:
        stream = follower.stream_logs(job.job_id, heartbeat_s=1.0)

        def follow() -> None:
            try:
                for line in stream:
                    followed.append(line)
                    if len(followed) == total // 2:
                        relay.cut()  # the TCP connection dies under the stream, mid-job
            except BaseException as exc:  # reported in the main thread
                failure.append(exc)

        thread = threading.Thread(target=follow)
        thread.start()
        # Pipelined: every forward_backward is queued at once, the worker prints one engine line each.
        for _ in range(total):
            client.forward_backward(job.job_id, BATCH)
        client.complete_job(job.job_id)
        thread.join(timeout=600)
    relay.close()

    assert not thread.is_alive() and not failure, failure
    assert relay.cuts == 1 and stream.reconnects >= 1
    assert stream.job_status == JOB_DONE
    assert_contiguous(followed)
    assert forward_backward_numbers(followed) == list(range(1, total + 1))

    paged = page_all(client, job.job_id, limit=777)
    assert_contiguous(paged)
    assert paged[0]["seq"] == 1
    assert forward_backward_numbers(paged) == list(range(1, total + 1))
    assert [line["seq"] for line in paged] == [line["seq"] for line in followed]
    assert [line["line"] for line in paged] == [line["line"] for line in followed]

    # A follower that gave up half-way picks up exactly the rest from its cursor.
    middle = paged[len(paged) // 2]["seq"]
    rest = list(client.stream_logs(job.job_id, cursor=middle))
    assert [line["seq"] for line in rest] == [line["seq"] for line in paged if line["seq"] > middle]
    # And without follow, the iterator pages through what is there and stops.
    assert [line["seq"] for line in client.stream_logs(job.job_id, follow=False)] == [
        line["seq"] for line in paged
    ]


def test_long_poll_returns_with_the_new_line(client):
    job = client.create_training_job("tiny", lora={"r": 1})
    cursor = client.tail_logs(job.job_id)["cursor"]
    client.forward_backward(job.job_id, BATCH)
    page = client.tail_logs(job.job_id, cursor, wait_s=30)
    assert forward_backward_numbers(page["lines"]) == [1]
    assert page["job_status"] == "running"
    job.complete()


def test_stream_of_a_finished_job_ends_with_its_status(client):
    job = client.create_training_job("tiny", lora={"r": 1})
    client.forward_backward(job.job_id, BATCH)
    job.complete()
    client.wait_for_job(job.job_id, until=(JOB_DONE,))
    stream = client.stream_logs(job.job_id)
    lines = list(stream)
    assert forward_backward_numbers(lines) == [1]
    assert stream.job_status == JOB_DONE and stream.reconnects == 0
    assert stream.cursor == lines[-1]["seq"]


def test_follow_stream_is_newline_delimited_json_with_typed_records(backend, client):
    job = client.create_training_job("tiny", lora={"r": 1})
    client.forward_backward(job.job_id, BATCH)
    job.complete()
    client.wait_for_job(job.job_id, until=(JOB_DONE,))
    response = httpx.get(
        f"{backend.url}/v1/jobs/{job.job_id}/logs",
        params={"follow": 1},
        headers={"Authorization": f"Bearer {backend.token}"},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    records = [httpx.Response(200, content=line).json() for line in response.text.splitlines()]
    assert {record["type"] for record in records[:-1]} == {"line"}
    assert records[-1] == {"type": "end", "cursor": records[-2]["seq"], "job_status": JOB_DONE}


def test_retention_drops_the_oldest_lines_and_every_reader_says_how_many(tmp_path):
    backend = start_backend(
        tmp_path / "backend", "--devices", "cpu:2", "--worker-threads", "1", "--log-retention-lines", "40"
    )
    try:
        with Client(backend.url, backend.token) as client:
            job = client.create_training_job("tiny", lora={"r": 1})
            for _ in range(120):
                client.forward_backward(job.job_id, BATCH)
            job.complete()
            client.wait_for_job(job.job_id, until=(JOB_DONE,))

            page = client.tail_logs(job.job_id, 0, 5000)
            assert page["retention_lines"] == 40
            assert 40 <= len(page["lines"]) <= 44  # trimmed in batches of a tenth of the bound
            assert page["dropped"] == page["lines"][0]["seq"] - 1 > 0
            assert_contiguous(page["lines"])
            assert forward_backward_numbers(page["lines"])[-1] == 120

            stream = client.stream_logs(job.job_id)
            streamed = list(stream)
            assert stream.dropped == page["dropped"]
            assert [line["seq"] for line in streamed] == [line["seq"] for line in page["lines"]]

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                paths = client.download_stdout_logs(job.job_id, tmp_path / "out")
            assert any("dropped" in str(warning.message) for warning in caught)
            assert paths["training-0"].read_text().splitlines() == [line["line"] for line in page["lines"]]
    finally:
        backend.stop()


def test_download_writes_stdout_per_sub_job(client, tmp_path):
    job = client.create_training_job("tiny", lora={"r": 1}, samplers=1)
    for _ in range(3):
        client.forward_backward(job.job_id, BATCH)
    job.complete()
    client.wait_for_job(job.job_id, until=(JOB_DONE,))
    paths = client.download_stdout_logs(job.job_id, tmp_path)
    assert set(paths) == {"training-0", "sampling-0"}
    assert paths["training-0"] == tmp_path / "training-0" / "stdout.log"
    training = paths["training-0"].read_text().splitlines()
    assert [
        int(FORWARD_BACKWARD_LINE.match(line).group(1))
        for line in training
        if FORWARD_BACKWARD_LINE.match(line)
    ] == [1, 2, 3]
    assert training[0].startswith("[engine] training-0 ready")
    assert paths["sampling-0"].read_text().startswith("[engine] sampling-0 ready")
    expected = [
        line["line"]
        for line in page_all(client, job.job_id, 1000)
        if line["sub_job_id"] == "training-0" and line["stream"] == "stdout"
    ]
    assert training == expected
    # No start-up noise of the libraries a worker imports (library_noise.py) in what the user reads.
    stderr = [line["line"] for line in page_all(client, job.job_id, 1000) if line["stream"] == "stderr"]
    assert not [line for line in stderr if "Failed to load" in line or "_pytree" in line], stderr[:5]


def test_logs_of_another_owner_are_not_found(backend, client):
    job = client.create_training_job("tiny", lora={"r": 1})
    with Client(backend.url, create_token(backend.data_dir, "mallory", "jobs:read", "jobs:write")) as other:
        with pytest.raises(NotFoundError):
            other.tail_logs(job.job_id)
        with pytest.raises(NotFoundError):
            list(other.stream_logs(job.job_id))
    job.complete()


def test_bad_log_arguments_are_refused_with_a_code(backend, client):
    job = client.create_training_job("tiny", lora={"r": 1}, wait=False)
    response = httpx.get(
        f"{backend.url}/v1/jobs/{job.job_id}/logs",
        params={"cursor": "abc"},
        headers={"Authorization": f"Bearer {backend.token}"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_field"
    job.cancel()
