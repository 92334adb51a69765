"""Client telemetry and operator metrics: what is recorded and sent, what is never sent (secrets),
what never changes (an operation's outcome), and the Prometheus text that aggregates it."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cortex_nb import BadRequestError, Client, ConnectionError, NotFoundError
from cortex_nb.protocol.redaction import bounded, redact
from cortex_nb.telemetry import Telemetry
from cortex_nb.transport import RetryPolicy

from .tokens import create_token

BATCH = {"input_ids": [[1, 2]], "target_tokens": [[2, 3]], "weights": [[1.0, 1.0]]}
SECRET = "ctx_" + "Zq7" * 12  # shaped like a real cortex-nb token


@pytest.fixture
def telemetry_on(monkeypatch):
    monkeypatch.delenv("CORTEX_DISABLE_TELEMETRY", raising=False)
    monkeypatch.delenv("CORTEX_ENABLE_SUCCESS_TELEMETRY", raising=False)


def scrape(backend) -> dict:
    response = httpx.get(f"{backend.url}/metrics", headers={"Authorization": f"Bearer {backend.token}"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = {family.name: family for family in text_string_to_metric_families(response.text)}
    return {"text": response.text, "families": families}


def value(families: dict, family: str, sample_name: str, **labels: str) -> float:
    total = 0.0
    for sample in families[family].samples:
        if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items()):
            total += sample.value
    return total


def admin_recent_telemetry(backend) -> list[dict]:
    response = httpx.get(
        f"{backend.url}/v1/telemetry",
        params={"limit": 1000},
        headers={"Authorization": f"Bearer {backend.token}"},
    )
    assert response.status_code == 200
    return response.json()["records"]


# redaction -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, secret",
    [
        (f"no job '{SECRET}' is visible to this token", SECRET),
        ("Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123", "abcdefghijklmnopqrstuvwxyz0123"),
        ("could not reach https://ann:hunter2hunter2@gpu-box:8765/v1", "hunter2hunter2"),
        ("GET /v1/x?access_token=s3cr3tvalue&limit=5", "s3cr3tvalue"),
        ('{"password": "correct horse battery"}', "correct horse"),
        ("CORTEX_TOKEN=abc123def456 in the environment", "abc123def456"),
        ("hf_" + "A1b2C3d4E5f6G7h8I9j0", "A1b2C3d4E5f6G7h8I9j0"),
        ("TINKER key tml-" + "Zx9_Yw8-Vu7Ts6Rq5Po4", "Zx9_Yw8-Vu7Ts6Rq5Po4"),
    ],
)
def test_redaction_removes_credentials_and_keeps_the_rest(text, secret):
    cleaned = redact(text)
    assert secret not in cleaned and "[REDACTED]" in cleaned
    assert redact(cleaned) == cleaned


def test_redaction_leaves_ordinary_lines_alone():
    for line in [
        "[engine] step=3 grad_norm=0.5 lr=0.0001 tokens=128 peak_memory=375MiB",
        "sampling_params: max_tokens=64 temperature=0.7",
        "job job-abc123 is cancelled",
    ]:
        assert redact(line) == line


def test_bounded_messages_are_redacted_before_they_are_cut():
    long = "x" * 490 + " " + SECRET
    cut = bounded(long, 500)
    assert len(cut) <= 500 and "Zq7Zq7" not in cut


# client telemetry ------------------------------------------------------------------------------------
def test_failures_are_sent_by_default_redacted_and_counted_in_metrics(backend, telemetry_on):
    before = scrape(backend)["families"]
    with Client(backend.url, backend.token) as client:
        assert client.telemetry.enabled and not client.telemetry.send_successes
        with pytest.raises(NotFoundError) as raised:
            client.get_job(SECRET)
        assert SECRET in str(raised.value)  # the caller's own exception is untouched
        client.list_jobs(limit=1)  # a success: recorded locally, not sent
        assert client.telemetry.flush(10)
        failure, success = list(client.telemetry.recent)[-2:]
        assert failure["operation"] == "get_job" and failure["success"] is False
        assert failure["error_type"] == "NotFoundError" and failure["http_status"] == 404
        assert (
            failure["error_code"] == "job_not_found" and failure["attempts"] == 1 and failure["retries"] == 0
        )
        assert SECRET not in failure["message"] and "ctx_[REDACTED]" in failure["message"]
        assert success["operation"] == "list_jobs" and success["success"] is True
        assert client.telemetry.sent >= 1

    received = [
        r for r in admin_recent_telemetry(backend) if r["operation"] == "get_job" and not r["success"]
    ]
    assert received and received[-1]["message"] == failure["message"]
    assert not any(r["operation"] == "list_jobs" and r["success"] for r in admin_recent_telemetry(backend))
    after = scrape(backend)
    assert SECRET not in after["text"]
    labels = {
        "operation": "get_job",
        "outcome": "failure",
        "error_type": "NotFoundError",
        "http_status": "404",
    }
    name = "cortex_client_operations"
    assert (
        value(after["families"], name, name + "_total", **labels)
        == value(before, name, name + "_total", **labels) + 1
    )


def test_successes_are_sent_only_when_asked(backend, telemetry_on, monkeypatch):
    monkeypatch.setenv("CORTEX_ENABLE_SUCCESS_TELEMETRY", "1")
    with Client(backend.url, backend.token) as client:
        job = client.create_training_job("tiny", lora={"r": 1})
        job.forward_backward(BATCH).result()
        job.complete()
        assert client.telemetry.flush(10)
        operations = [record["operation"] for record in client.telemetry.recent]
    # Nested calls count once, as the outermost operation (poll_request, not its get_request_status).
    assert operations[:5] == [
        "check_version",
        "create_job",
        "wait_for_job",
        "forward_backward",
        "poll_request",
    ]
    assert operations[-1] == "complete_job"
    families = scrape(backend)["families"]
    assert (
        value(
            families,
            "cortex_client_operations",
            "cortex_client_operations_total",
            operation="forward_backward",
            outcome="success",
        )
        >= 1
    )
    assert (
        value(
            families,
            "cortex_client_operation_duration_seconds",
            "cortex_client_operation_duration_seconds_count",
            operation="forward_backward",
            outcome="success",
        )
        >= 1
    )


def test_disabling_telemetry_records_and_sends_nothing(backend, monkeypatch):
    monkeypatch.setenv("CORTEX_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("CORTEX_ENABLE_SUCCESS_TELEMETRY", "1")
    with Client(backend.url, backend.token) as client:
        with pytest.raises(NotFoundError):
            client.get_job("job-none")
        assert (
            not client.telemetry.enabled
            and list(client.telemetry.recent) == []
            and client.telemetry.sent == 0
        )


def test_retries_and_attempts_are_counted(telemetry_on):
    # Nothing listens on this port: every attempt fails to connect, and the client retries.
    client = Client(
        "http://127.0.0.1:9",
        None,
        check_version=False,
        retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01),
    )
    with pytest.raises(ConnectionError) as raised:
        client.check_version()
    record = client.telemetry.recent[-1]
    assert record["attempts"] == 3 and record["retries"] == 2 and record["error_type"] == "ConnectionError"
    assert record["http_status"] is None and record["error_code"] == "backend_unavailable"
    assert str(raised.value).startswith("[backend_unavailable] could not reach")
    client.close()


def test_a_password_in_the_url_never_reaches_telemetry(telemetry_on):
    client = Client(
        "http://ann:pa55word-abc@127.0.0.1:9", "tok", check_version=False, retry=RetryPolicy(max_attempts=1)
    )
    with pytest.raises(ConnectionError) as raised:
        client.get_job("job-x")
    assert "pa55word-abc" in str(raised.value)
    assert "pa55word-abc" not in client.telemetry.recent[-1]["message"]
    client.close()


def test_a_telemetry_failure_never_changes_an_outcome_or_blocks_the_caller(backend, telemetry_on):
    with Client(backend.url, backend.token) as client:
        # Sending will fail (the sender gets a refused connection) and must not matter.
        client.telemetry.url = "http://127.0.0.1:9"
        job = client.create_training_job("tiny", lora={"r": 1})
        assert job.forward_backward(BATCH).result()["loss"] > 0
        with pytest.raises(NotFoundError):
            client.get_job("job-missing")
        job.complete()
    # Recording happens on the caller's thread but sending does not: a sender that is stuck does not
    # hold the caller (the queue is bounded and drops instead of waiting).
    stuck = threading.Event()
    telemetry = Telemetry("http://127.0.0.1:9", enabled=True, send_successes=True)
    telemetry._send_loop = lambda: stuck.wait()  # the sender thread never takes anything off the queue
    for _ in range(1200):
        telemetry.record("get_job", success=True, duration_ms=1.0)
    assert telemetry.dropped == 1200 - 1000
    stuck.set()


def test_malformed_telemetry_is_refused_or_counted_not_trusted(backend):
    headers = {"Authorization": f"Bearer {backend.token}"}
    bad = httpx.post(f"{backend.url}/v1/telemetry", json={"records": "nope"}, headers=headers)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_field"
    before = scrape(backend)["families"]
    odd = httpx.post(
        f"{backend.url}/v1/telemetry",
        headers=headers,
        json={
            "records": [
                {
                    "operation": "made_up_op",
                    "success": False,
                    "duration_ms": 5,
                    "error_type": "Whatever",
                    "http_status": 500,
                    "message": f"Bearer {SECRET}",
                },
                {"operation": "get_job", "success": "yes", "duration_ms": 5},
            ]
        },
    )
    assert odd.status_code == 202 and odd.json() == {"accepted": 1}
    after = scrape(backend)
    assert (
        value(
            after["families"],
            "cortex_client_operations",
            "cortex_client_operations_total",
            operation="other",
            error_type="other",
            http_status="500",
        )
        == value(
            before,
            "cortex_client_operations",
            "cortex_client_operations_total",
            operation="other",
            error_type="other",
            http_status="500",
        )
        + 1
    )
    assert (
        value(
            after["families"], "cortex_telemetry_records_rejected", "cortex_telemetry_records_rejected_total"
        )
        == value(before, "cortex_telemetry_records_rejected", "cortex_telemetry_records_rejected_total") + 1
    )
    assert SECRET not in after["text"]
    assert all(SECRET not in str(record) for record in admin_recent_telemetry(backend))
    reader = create_token(backend.data_dir, "ursula", "jobs:read", "jobs:write")
    denied = httpx.get(f"{backend.url}/v1/telemetry", headers={"Authorization": f"Bearer {reader}"})
    assert denied.status_code == 403


# a secret in an error message, end to end -----------------------------------------------------------
def test_a_secret_in_an_error_message_reaches_only_its_owner(backend, telemetry_on):
    owner_token = create_token(backend.data_dir, "olive", "jobs:read", "jobs:write")
    with Client(backend.url, owner_token) as owner:
        # The backend refuses an unknown LoRA module by name: the secret is in the owner's error.
        with pytest.raises(BadRequestError) as raised:
            owner.create_job(
                [{"type": "training", "base_model": "tiny", "lora": {"target_modules": [SECRET]}}]
            )
        assert raised.value.code == "invalid_field" and SECRET in str(raised.value)
        # A checkpoint named like the secret: the worker logs its name when it loads it.
        job = owner.create_training_job("tiny", lora={"r": 4})
        job.save(SECRET, "weights-only").result()
        job.load(SECRET).result()
        own_lines = [line["line"] for line in owner.stream_logs(job.job_id, follow=False)]
        assert any(SECRET in line for line in own_lines), "the owner sees their own logs unchanged"
        # An operation that fails with the secret in its error message: telemetry sends it redacted.
        with pytest.raises(Exception) as refused:
            owner.create_job([{"type": "training", "base_model": SECRET}])
        assert SECRET in str(refused.value)
        assert owner.telemetry.flush(10) and owner.telemetry.sent >= 1
        assert owner.telemetry.recent[-1]["operation"] == "create_job"
        assert "ctx_[REDACTED]" in owner.telemetry.recent[-1]["message"]
        assert all(SECRET not in str(record) for record in owner.telemetry.recent)

    with Client(backend.url, create_token(backend.data_dir, "nosy", "jobs:read", "jobs:write")) as stranger:
        with pytest.raises(NotFoundError) as hidden:
            stranger.tail_logs(job.job_id)
        assert SECRET not in str(hidden.value)
        assert all(event["job_id"] != job.job_id for event in stranger.list_events(limit=1000)["events"])

    with Client(backend.url, backend.token) as admin:  # sees every job, but not its owner's secrets
        admin_lines = [line["line"] for line in admin.stream_logs(job.job_id, follow=False)]
        assert len(admin_lines) == len(own_lines)
        assert not any(SECRET in line for line in admin_lines)
        assert any("ctx_[REDACTED]" in line for line in admin_lines)
        assert all(SECRET not in line["line"] for line in admin.tail_logs(job.job_id, limit=5000)["lines"])
        admin.cancel_job(job.job_id)
    assert all(SECRET not in str(record) for record in admin_recent_telemetry(backend))
    assert SECRET not in scrape(backend)["text"]


# /metrics ----------------------------------------------------------------------------------------------
def test_operator_metrics_parse_and_count_routes_statuses_queue_and_devices(backend, client):
    before = scrape(backend)["families"]
    client.list_jobs(limit=1)
    with pytest.raises(NotFoundError):
        client.get_job("job-nope")
    time.sleep(1.2)  # one monitor tick
    after = scrape(backend)["families"]
    requests = "cortex_http_requests"
    assert (
        value(after, requests, requests + "_total", route="list_jobs", method="GET", status="200")
        >= value(before, requests, requests + "_total", route="list_jobs", method="GET", status="200") + 1
    )
    assert (
        value(after, requests, requests + "_total", route="get_job", status="404")
        == value(before, requests, requests + "_total", route="get_job", status="404") + 1
    )
    latency = "cortex_http_request_duration_seconds"
    assert after[latency].type == "histogram"
    assert value(after, latency, latency + "_count", route="list_jobs") >= 1
    assert any(s.name == latency + "_bucket" and s.labels.get("le") == "+Inf" for s in after[latency].samples)
    assert after["cortex_queue_depth"].samples[0].value >= 0
    assert after["cortex_active_sub_jobs"].type == "gauge"
    assert value(after, "cortex_device_slots", "cortex_device_slots", device="cpu") == 8
    assert 0 <= value(after, "cortex_host_cpu_percent", "cortex_host_cpu_percent", device="cpu") <= 100
    assert value(after, "cortex_host_ram_total_bytes", "cortex_host_ram_total_bytes", device="cpu") > 0
    assert after["cortex_gpu_utilization_percent"].samples == []  # no GPU here: no series, not zeros
    assert after["cortex_gpu_metrics_available"].samples[0].value == 0
    assert after["cortex_log_lines"].samples[0].value > 0


def test_operator_metrics_need_a_token(backend):
    assert httpx.get(f"{backend.url}/metrics").status_code == 401
