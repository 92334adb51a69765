"""Bad input through the Cortex SDK: every case of our own bad-input table (tests/test_bad_input.py), and
what cannot exist here, answers with a clear error, a status the SDK does not retry, and exactly one
request (no retry storm). How fast the SDK surfaces such an error is measured in bench/bench_cortex_sdk.py."""

from __future__ import annotations

import re

import pytest
import requests
import torch
from cortex_training import CortexTrainingClient, SubJobConfig, serialize_forward_backward_args
from cortex_training import wire as sdk_wire

from .tokens import create_token

pytestmark = pytest.mark.filterwarnings(
    "ignore::urllib3.exceptions.InsecureRequestWarning",
    "ignore:The 'initial' parameter is deprecated:DeprecationWarning",
)
SDK_RETRIES = {404, 409, 429, 500, 502, 503, 504}
ADMIN_TOKEN: list[str] = []  # the backend's admin token, to read its counters
KWARGS = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "labels": torch.tensor([[6, 7, 8, -100]])}


def make_client(backend, token: str) -> CortexTrainingClient:
    return CortexTrainingClient.from_pat(
        backend.url.removeprefix("https://"), token, "DB", "SCHEMA", verify_ssl=False
    )


@pytest.fixture(scope="module")
def sdk(tls_backend):
    with pytest.MonkeyPatch.context() as patch:
        for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
            patch.delenv(name, raising=False)
        # The SDK reports each failure to its OTLP telemetry (answered 501 here, see test_cortex_sdk.py);
        # off here so the request counts below see only the calls under test.
        patch.setenv("CORTEX_TRAINING_DISABLE_TELEMETRY", "1")
        ADMIN_TOKEN[:] = [tls_backend.token]
        client = make_client(tls_backend, tls_backend.token)
        yield client
        client.close()


@pytest.fixture(scope="module")
def jobs(sdk):
    """A running training job, and a cancelled one."""
    config = SubJobConfig.training_job(
        "tiny", optimizer={"lr": 1e-3}, max_seq_len=32, train_batch_size=1, n_gpus=1
    )
    running, finished = sdk.create_job([config]), sdk.create_job([config])
    sdk.cancel_job(finished)
    sdk.wait_for_job(running)
    sdk.poll_request(running, sdk.save(running, checkpoint_id="taken"))
    yield running, finished
    sdk.cancel_job(running)


def error_count(sdk) -> float:
    """Answers with a 4xx/5xx status the backend gave on this surface (its Prometheus counters)."""
    text = requests.get(
        sdk.base_url + "/metrics",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN[0]}"},
        verify=False,
        timeout=30,
    ).text
    return sum(
        float(value)
        for value in re.findall(
            r'^cortex_http_requests_total\{[^}]*route="cortex:[^"]*"[^}]*status="[45]\d\d"[^}]*\} (\S+)$',
            text,
            re.M,
        )
    )


def refused(sdk, call, status: int, code: str) -> None:
    """One request, answered with a status the SDK does not retry (it would retry for about a minute), so
    the error surfaces at once; bench/bench_cortex_sdk.py measures how fast."""
    before = error_count(sdk)
    with pytest.raises(requests.HTTPError) as caught:
        call()
    response = caught.value.response
    assert response.status_code == status and status not in SDK_RETRIES
    assert response.json()["error"]["code"] == code and code in str(
        caught.value
    )  # the reason phrase carries it
    assert "Traceback" not in response.text
    assert error_count(sdk) - before == 1, "the SDK retried"


def model_config(name="tiny", **peft):
    return SubJobConfig.training_job(
        name,
        optimizer={"lr": 1e-3},
        max_seq_len=32,
        train_batch_size=1,
        n_gpus=1,
        extra_training={"peft_config": {"peft_type": "LORA", **peft}} if peft else None,
    )


def fb(sdk, job_id, value):
    return lambda: sdk.forward_backward(
        job_id, sdk_wire.dumps(value) if not isinstance(value, bytes) else value
    )


def test_bad_batches(sdk, jobs):
    job_id, _ = jobs
    refused(sdk, fb(sdk, job_id, b"garbage"), 400, "invalid_frame")
    refused(
        sdk,
        fb(sdk, job_id, {"args": (), "kwargs": KWARGS, "processing": {"loss_fn": "mse"}}),
        400,
        "unknown_loss",
    )
    short = {"input_ids": KWARGS["input_ids"], "labels": KWARGS["labels"][:, :2]}
    refused(sdk, fb(sdk, job_id, {"args": (), "kwargs": short}), 400, "invalid_batch")
    out_of_vocab = {"input_ids": torch.tensor([[5, 100_000]]), "labels": torch.tensor([[6, -100]])}
    refused(sdk, fb(sdk, job_id, {"args": (), "kwargs": out_of_vocab}), 400, "invalid_batch")
    refused(
        sdk, fb(sdk, job_id, {"args": (), "kwargs": {"input_ids": KWARGS["input_ids"]}}), 400, "invalid_batch"
    )
    refused(
        sdk,
        lambda: sdk.fwd(job_id, {"kwargs": {"input_ids": [[1, 2]], "labels": [[2, -7]]}}),
        400,
        "invalid_batch",
    )
    refused(sdk, lambda: sdk.generate(job_id, [], {"max_tokens": 4}), 400, "invalid_field")
    # A chunk above the 64 MiB a body may hold (the SDK's own chunks stay under 60 MiB): 413, not retried.
    huge = serialize_forward_backward_args((), {"input_ids": torch.zeros(1, 8_500_000, dtype=torch.long)})
    sdk._MAX_FWD_BWD_BYTES = len(huge) + 1024 * 1024
    try:
        with pytest.raises(requests.HTTPError) as caught:
            sdk.forward_backward(job_id, huge)
    finally:
        del sdk._MAX_FWD_BWD_BYTES
    assert caught.value.response.status_code == 413 and "body_too_large" in str(caught.value)
    refused(sdk, lambda: sdk.generate(job_id, ["x"], {"top_p": 0}), 400, "invalid_field")
    refused(sdk, lambda: sdk.generate(job_id, ["x"], {"presence_penalty": 0.5}), 501, "not_supported")


def test_bad_jobs(sdk):
    refused(sdk, lambda: sdk.create_job([model_config("llama-70b")]), 400, "unknown_model")
    for name in ("/etc/passwd", "../models/x", "http://example.com/model"):
        refused(sdk, lambda name=name: sdk.create_job([model_config(name)]), 400, "invalid_model_name")
    refused(sdk, lambda: sdk.create_job([model_config(r=-1)]), 400, "invalid_field")
    refused(
        sdk,
        lambda: sdk.create_job_from_body({"sub_job_configs": [model_config().to_wire()], "colour": "red"}),
        400,
        "invalid_field",
    )
    # A training sub-job runs across devices (tests/test_multi_rank_training.py); a sampling one does not.
    two_gpu_sampler = SubJobConfig.sampling_job("tiny", max_seq_len=32, n_gpus=2)
    refused(
        sdk, lambda: sdk.create_job([model_config(), two_gpu_sampler]), 400, "multi_gpu_sampling_unsupported"
    )
    with pytest.raises(ValueError, match="at most one training"):  # the SDK itself refuses this one
        sdk.create_job([model_config(), model_config()])


def test_permanent_state_errors_are_not_retried(sdk, jobs, tls_backend):
    running, finished = jobs
    refused(sdk, lambda: sdk.get_job("job-does-not-exist"), 400, "job_not_found")
    refused(sdk, lambda: sdk.step("job-does-not-exist"), 400, "job_not_found")
    refused(sdk, lambda: sdk.step(finished), 410, "job_finished")
    refused(sdk, lambda: sdk.save(running, checkpoint_id="taken"), 422, "checkpoint_exists")
    refused(sdk, lambda: sdk.delete_checkpoint(running, "never-saved"), 400, "checkpoint_not_found")
    refused(sdk, lambda: sdk.get_request_status(running, "req-0000000000000000"), 400, "request_not_found")
    bob = make_client(tls_backend, create_token(tls_backend.data_dir, "bob", "jobs:read", "jobs:write"))
    refused(
        bob, lambda: bob.get_job(running), 400, "job_not_found"
    )  # another owner's job does not exist for bob
    reader = make_client(tls_backend, create_token(tls_backend.data_dir, "sdk-reader", "jobs:read"))
    refused(reader, lambda: reader.step(running), 403, "forbidden")
    stranger = make_client(tls_backend, "ctx_wrong")
    with pytest.raises(requests.HTTPError) as caught:
        stranger.list_jobs()
    assert caught.value.response.status_code == 401 and "unauthenticated" in str(caught.value)


def test_what_cannot_exist_here_names_the_equivalent(sdk, jobs):
    job_id, _ = jobs
    refused(sdk, lambda: sdk.get_experiment_run(job_id), 501, "not_supported")
    refused(sdk, lambda: sdk.tail_events(job_id), 501, "not_supported")
    with pytest.raises(requests.HTTPError) as caught:
        sdk.fetch_execution_logs(job_id)
    assert "Client.download_stdout_logs" in caught.value.response.json()["error"]["message"]
    with pytest.raises(requests.HTTPError) as caught:
        sdk.forward_backward(
            job_id,
            serialize_forward_backward_args((), {**KWARGS, "position_ids": torch.tensor([[0, 0, 1, 2]])}),
        )
    assert (
        caught.value.response.status_code == 501
        and "position_ids" in caught.value.response.json()["error"]["message"]
    )


def test_a_chunk_group_cut_by_a_restart_answers_restart_required(tmp_path):
    """Open chunk groups live only in the backend's memory: after a restart the next chunk of a group
    asks for a replay from chunk 0 (409 chunk_group_restart_required, which the SDK replays once)."""
    import httpx

    from .backend_process import start_backend

    args = ("--devices", "cpu:1", "--warm-workers", "0")
    first = start_backend(tmp_path / "data", *args)
    headers = {"Authorization": f"Bearer {first.token}"}
    try:
        job_id = httpx.post(
            first.url + "/v1/jobs",
            json={"sub_jobs": [{"type": "sampling", "base_model": "tiny"}]},
            headers=headers,
            timeout=30,
        ).json()["job_id"]
        tokens = torch.arange(4000).reshape(40, 100) % 250
        frame = serialize_forward_backward_args((), {"input_ids": tokens, "labels": tokens})
        chunks = sdk_wire.encode_byte_chunks(frame, kind="request", operation="fwd-bwd", max_bytes=16 * 1024)
        path = f"/api/v2/databases/DB/schemas/SCHEMA/cortex-training/{job_id}/forward-backward"
        assert (
            httpx.post(first.url + path, content=chunks[0], headers=headers, timeout=30).json()["status"]
            == "received"
        )
    finally:
        first.stop()
    second = start_backend(tmp_path / "data", *args)
    try:
        answer = httpx.post(second.url + path, content=chunks[1], headers=headers, timeout=30)
        assert answer.status_code == 409
        error = answer.json()["error"]
        assert error["code"] == "chunk_group_restart_required" and error["detail"]["chunk_idx"] == 1
        # The replay from chunk 0 reaches the job, which the restart ended: a permanent, unretried 410.
        replay = httpx.post(second.url + path, content=chunks[0], headers=headers, timeout=30)
        assert replay.status_code == 410 and replay.json()["error"]["code"] == "job_finished"
    finally:
        second.stop()


def test_generate_stream_drains_tokens_then_results(sdk, jobs):
    """The SDK's polling stream: token events as decoded, one result per sample, then done; the tokens
    joined are the result's, and the result is a plain generate's."""
    running, _ = jobs
    params = {"max_tokens": 12, "temperature": 0}
    answer = sdk.generate_stream(running, [[5, 6, 7]], params)
    assert answer["count"] == 1
    events: list[dict] = []
    for _ in range(200):
        events += sdk.get_request_status(running, answer["request_id"], max_events=4)["events"]
        if events and events[-1]["type"] == "done":
            break
    kinds = [event["type"] for event in events]
    assert kinds[-1] == "done" and kinds.count("result") == 1 and kinds.count("tokens") > 1
    assert events[-1] == {"type": "done", "completed": 1, "failed": 0}
    streamed = [token for event in events if event["type"] == "tokens" for token in event["token_ids"]]
    result = next(event["result"] for event in events if event["type"] == "result")
    assert streamed == result["token_ids"]
    plain = sdk.poll_request(running, sdk.generate(running, [[5, 6, 7]], params))
    assert plain["results"][0]["token_ids"] == streamed
