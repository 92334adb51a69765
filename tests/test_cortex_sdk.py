"""The published `cortex-training` SDK, unmodified, drives a real cortex-nb backend over TLS through its
public methods: training parity with transformers and with our own client, greedy generate, forward
without gradients, chunked frames, checkpoints into plain peft, weight sync, logs, and jobs that are
ordinary jobs."""

from __future__ import annotations

import hashlib

import httpx
import numpy as np
import pytest
import torch
from cortex_training import (
    CortexTrainingClient,
    JobType,
    SubJobConfig,
    build_forward_backward_kwargs,
    serialize_forward_backward_args,
)
from cortex_training import wire as sdk_wire

from cortex_nb import Client

from .reference import ReferenceTrainer, reference_base, reference_logprobs, reference_lora
from .test_generate import hf_greedy

LR = 1e-2
TOLERANCE = 1e-5
LORA = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"}
DATABASE, SCHEMA = "TRAINING_DB", "PUBLIC"

pytestmark = pytest.mark.filterwarnings(
    "ignore::urllib3.exceptions.InsecureRequestWarning",
    "ignore:The 'initial' parameter is deprecated:DeprecationWarning",
)


@pytest.fixture(scope="module")
def sdk(tls_backend):
    """`CortexTrainingClient.from_pat` against the TLS backend, as a user would make it."""
    # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override verify=False; keep them out of the way.
    with pytest.MonkeyPatch.context() as patch:
        for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
            patch.delenv(name, raising=False)
        client = CortexTrainingClient.from_pat(
            tls_backend.url.removeprefix("https://"), tls_backend.token, DATABASE, SCHEMA, verify_ssl=False
        )
        yield client
        client.close()


@pytest.fixture(scope="module")
def ours(tls_backend):
    with Client(tls_backend.url, tls_backend.token, verify=tls_backend.fingerprint) as client:
        yield client


def training_job(sdk, seed=3, **extra) -> str:
    config = SubJobConfig.training_job(
        "tiny",
        optimizer={"name": "AdamW", "lr": LR},
        max_seq_len=128,
        train_batch_size=4,
        n_gpus=1,
        seed=seed,
        extra_training={"peft_config": LORA},
    )
    return sdk.create_job([config], idle_timeout_seconds=0, **extra)


def sdk_batch(rng: np.random.Generator, batch: int = 3, length: int = 24) -> dict[str, torch.Tensor]:
    """Random tokens, right-padded rows, labels as the SDK builds them (next token, -100 where none)."""
    input_ids = rng.integers(0, 259, size=(batch, length))
    mask = np.ones((batch, length), dtype=np.int64)
    for row in range(1, batch, 2):
        mask[row, length - int(rng.integers(2, length // 2)) :] = 0
    return build_forward_backward_kwargs(
        {"input_ids": input_ids.tolist(), "attention_mask": mask.tolist(), "include_attention_mask": True}
    )


def our_batch(kwargs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The same batch in cortex-nb's terms (and the reference's)."""
    labels = kwargs["labels"].numpy()
    return {
        "input_ids": kwargs["input_ids"].numpy(),
        "attention_mask": kwargs["attention_mask"].numpy(),
        "target_tokens": np.where(labels == -100, 0, labels),
        "weights": (labels != -100).astype(np.float32),
    }


def frame(kwargs) -> bytes:
    return serialize_forward_backward_args((), kwargs)


def test_training_matches_transformers_and_our_own_client(sdk, ours):
    job_id = training_job(sdk)
    assert sdk.wait_for_job(job_id)["status"] == "running"
    mine = ours.create_training_job(
        "tiny", lora={"r": 8, "alpha": 16, "dropout": 0.0}, optimizer={"lr": LR}, seed=3
    )
    reference = ReferenceTrainer(reference_lora(reference_base("tiny"), r=8, alpha=16, seed=3), lr=LR)
    rng = np.random.default_rng(7)
    try:
        for step in range(5):
            kwargs = sdk_batch(rng)
            batch = our_batch(kwargs)
            result = sdk.poll_request(job_id, sdk.forward_backward(job_id, frame(kwargs)))
            stepped = sdk.poll_request(job_id, sdk.step(job_id))
            expected, _ = reference.train_step(batch)  # transformers' summed token NLL on the same labels
            theirs = mine.forward_backward(batch).result()
            mine.step().result()
            assert result["loss"] == pytest.approx(expected, rel=TOLERANCE, abs=TOLERANCE), f"step {step}"
            assert result["loss"] == pytest.approx(theirs["loss"], rel=TOLERANCE, abs=TOLERANCE)
            assert result["avg_loss"] == pytest.approx(expected / batch["weights"].sum(), rel=TOLERANCE)
            assert result["metrics"]["loss:sum"] == pytest.approx(result["loss"])
            assert stepped["global_steps"] == step + 1 and stepped["last_lr"] == pytest.approx(LR)
        # Greedy generate after training equals transformers' generate on the reference adapter.
        reference.model.eval()
        prompts = [rng.integers(0, 259, size=n).tolist() for n in (3, 7)]
        text_prompt = "The lamp"
        result = sdk.poll_request(
            job_id, sdk.generate(job_id, [*prompts, text_prompt], {"max_tokens": 12, "temperature": 0})
        )
        samples = result["results"]
        assert [s["prompt_index"] for s in samples] == [0, 1, 2]
        for prompt, sample in zip([*prompts, ours.tokenize("tiny", [text_prompt])[0]], samples, strict=True):
            expected = hf_greedy(reference.model, prompt, 12)
            assert sample["token_ids"] == expected[: len(sample["token_ids"])]
        # One sampling-params dict per prompt: each prompt gets its own, results stay in prompt order.
        result = sdk.poll_request(
            job_id,
            sdk.generate(
                job_id, prompts, [{"max_tokens": 3, "temperature": 0}, {"max_tokens": 5, "temperature": 0}]
            ),
        )
        assert [len(s["token_ids"]) for s in result["results"]] == [3, 5]
        assert result["results"][1]["token_ids"] == hf_greedy(reference.model, prompts[1], 5)
    finally:
        sdk.cancel_job(job_id)
        mine.cancel()


def test_fwd_no_grad_leaves_adapter_and_optimizer_untouched(sdk):
    job_id = training_job(sdk, seed=5)
    reference = ReferenceTrainer(reference_lora(reference_base("tiny"), r=8, alpha=16, seed=5), lr=LR)
    rng = np.random.default_rng(3)
    first, probe = sdk_batch(rng), sdk_batch(rng, batch=2, length=16)
    try:
        sdk.wait_for_job(job_id)
        sdk.poll_request(job_id, sdk.forward_backward(job_id, frame(first)))
        sdk.poll_request(job_id, sdk.step(job_id))  # the optimizer now has state
        reference.train_step(our_batch(first))
        before = _adapter_sha(sdk, job_id, "before")
        # fwd_no_grad with DSSST1 bytes, fwd with JSON lists: both score, neither trains.
        scored = sdk.poll_request(job_id, sdk.fwd_no_grad(job_id, frame(probe))["request_id"])
        as_lists = {name: tensor.tolist() for name, tensor in probe.items()}
        scored_json = sdk.poll_request(job_id, sdk.fwd(job_id, {"kwargs": as_lists})["request_id"])
        torch.testing.assert_close(scored["logprobs"], scored_json["logprobs"])
        counted = probe["labels"] != -100
        assert scored["loss"] == pytest.approx(-float(scored["logprobs"][counted].sum()), rel=1e-5)
        assert float(scored["logprobs"][~counted].abs().sum()) == 0.0
        reference.model.eval()
        with torch.no_grad():
            expected = reference_logprobs(reference.model, our_batch(probe)) * counted
        torch.testing.assert_close(scored["logprobs"], expected, rtol=0, atol=TOLERANCE)
        with pytest.raises(RuntimeError, match="no_gradients"):  # no gradient was accumulated
            sdk.poll_request(job_id, sdk.step(job_id))
        assert _adapter_sha(sdk, job_id, "after") == before
        # The optimizer state too: the next step moves the job exactly as the reference, which never scored.
        for _ in range(2):
            loss = sdk.poll_request(job_id, sdk.forward_backward(job_id, frame(first)))["loss"]
            sdk.poll_request(job_id, sdk.step(job_id))
            assert loss == pytest.approx(
                reference.train_step(our_batch(first))[0], rel=TOLERANCE, abs=TOLERANCE
            )
    finally:
        sdk.cancel_job(job_id)


def _adapter_sha(sdk, job_id: str, checkpoint_id: str) -> dict[str, str]:
    sdk.poll_request(job_id, sdk.save(job_id, checkpoint_id=checkpoint_id, checkpoint_type="weights-only"))
    return {f["filename"]: f["sha256"] for f in sdk.export_checkpoint(job_id, checkpoint_id)["files"]}


def test_chunked_forward_backward_assembles_once(sdk, ours, tls_backend):
    job_id = training_job(sdk)
    kwargs = sdk_batch(np.random.default_rng(1), batch=16, length=96)
    payload = frame(kwargs)
    try:
        sdk.wait_for_job(job_id)
        whole = sdk.poll_request(job_id, sdk.forward_backward(job_id, payload))
        sdk._MAX_FWD_BWD_BYTES = 16 * 1024  # the SDK's own chunk size knob: force several chunks
        try:
            chunked = sdk.poll_request(job_id, sdk.forward_backward(job_id, payload))
        finally:
            del sdk._MAX_FWD_BWD_BYTES
        assert chunked["loss"] == pytest.approx(whole["loss"], rel=1e-6)  # no step between: same weights
        chunks = sdk_wire.encode_byte_chunks(
            payload, kind="request", operation="fwd-bwd", max_bytes=16 * 1024
        )
        assert len(chunks) > 3
        url = f"{tls_backend.url}/api/v2/databases/{DATABASE}/schemas/{SCHEMA}/cortex-training/{job_id}/forward-backward"
        headers = {"Authorization": f"Bearer {tls_backend.token}", "Content-Type": "application/octet-stream"}
        with httpx.Client(verify=tls_backend.httpx_verify, timeout=60) as http:
            answers = [http.post(url, content=chunk, headers=headers) for chunk in chunks]
            assert all("request_id" not in a.json() for a in answers[:-1])
            request_id = answers[-1].json()["request_id"]
            again = http.post(url, content=chunks[-1], headers=headers).json()  # a retried last chunk
            assert again["request_id"] == request_id
            other = sdk_wire.encode_byte_chunks(
                payload, kind="request", operation="fwd-bwd", max_bytes=16 * 1024
            )
            lost = http.post(
                url, content=other[1], headers=headers
            )  # a group whose chunk 0 this backend never saw
            assert lost.status_code == 409 and lost.json()["error"]["code"] == "chunk_group_restart_required"
        sdk.poll_request(job_id, request_id)
        ran = [
            r
            for r in ours.transport.json("GET", f"/v1/jobs/{job_id}/requests")["requests"]
            if r["op"] == "forward_backward"
        ]
        assert len(ran) == 3  # whole, chunked through the SDK, chunked by hand (its retry ran nothing)
    finally:
        sdk.cancel_job(job_id)


def test_save_load_export_and_plain_peft(sdk, tmp_path):
    from peft import PeftModel

    job_id = training_job(sdk, seed=9)
    rng = np.random.default_rng(5)
    probe = sdk_batch(rng, batch=2, length=12)
    try:
        sdk.wait_for_job(job_id)
        for _ in range(2):
            sdk.poll_request(job_id, sdk.forward_backward(job_id, frame(sdk_batch(rng))))
            sdk.poll_request(job_id, sdk.step(job_id))
        saved = sdk.poll_request(
            job_id, sdk.save(job_id, checkpoint_id="trained", checkpoint_type="resumable")
        )
        assert saved["checkpoint_id"] == "trained" and saved["global_steps"] == 2
        assert [c["checkpoint_id"] for c in sdk.list_checkpoints(job_id)] == ["trained"]
        expected = sdk.poll_request(job_id, sdk.fwd(job_id, frame(probe))["request_id"])["logprobs"]
        # Train on, then load the checkpoint back (naming the sub-job the SDK's way): the scores return.
        sdk.poll_request(job_id, sdk.forward_backward(job_id, frame(sdk_batch(rng))))
        sdk.poll_request(job_id, sdk.step(job_id))
        moved = sdk.poll_request(job_id, sdk.fwd(job_id, frame(probe))["request_id"])["logprobs"]
        assert not torch.allclose(moved, expected, atol=TOLERANCE)
        sdk.poll_request(
            job_id,
            sdk.load(job_id, "trained", source_job_id=job_id, target_sub_job_id=f"{job_id}:training:0"),
        )
        loaded = sdk.poll_request(job_id, sdk.fwd(job_id, frame(probe))["request_id"])["logprobs"]
        torch.testing.assert_close(loaded, expected, rtol=0, atol=TOLERANCE)
        export = sdk.export_checkpoint(job_id, "trained")
        adapter = tmp_path / "adapter"
        adapter.mkdir()
        for item in export["files"]:  # links need no token: the signature is the grant
            data = httpx.get(item["url"], verify=False, timeout=60).content
            assert hashlib.sha256(data).hexdigest() == item["sha256"]
            (adapter / item["filename"]).write_bytes(data)
        assert (
            httpx.get(
                export["files"][0]["url"].replace("signature=", "signature=0"), verify=False
            ).status_code
            == 403
        )
        model = PeftModel.from_pretrained(reference_base("tiny"), str(adapter)).eval()
        labels = probe["labels"].numpy()
        batch = {
            "input_ids": probe["input_ids"].numpy(),
            "attention_mask": probe["attention_mask"].numpy(),
            "target_tokens": np.where(labels == -100, 0, labels),
        }
        with torch.no_grad():
            plain = reference_logprobs(model, batch) * torch.from_numpy(labels != -100)
        torch.testing.assert_close(plain, expected, rtol=0, atol=TOLERANCE)
        sdk.delete_checkpoint(job_id, "trained")
        assert sdk.list_checkpoints(job_id) == []
    finally:
        sdk.cancel_job(job_id)


def test_weight_sync_logs_and_ordinary_jobs(sdk, ours, tls_backend, cortex_shell, backend):
    trainer = SubJobConfig.training_job(
        "tiny",
        optimizer={"name": "AdamW", "lr": 5e-2},
        max_seq_len=128,
        train_batch_size=2,
        n_gpus=1,
        seed=1,
        extra_training={"peft_config": LORA},
    )
    sampler = SubJobConfig.sampling_job(
        "tiny", max_seq_len=128, n_gpus=1, extra_sampling={"peft_config": LORA}
    )
    job_id = sdk.create_job([trainer, sampler], experiment_name="sdk-demo")
    rng = np.random.default_rng(2)
    probe = sdk_batch(rng, batch=1, length=10)
    try:
        job = sdk.wait_for_job(job_id)
        assert {s["sub_job_id"] for s in job["sub_jobs"]} == {f"{job_id}:training:0", f"{job_id}:sampling:0"}
        assert job["sub_jobs"][1]["inference_config"]["max_seq_len"] == 128
        for _ in range(2):
            sdk.poll_request(job_id, sdk.forward_backward(job_id, frame(sdk_batch(rng))))
            sdk.poll_request(job_id, sdk.step(job_id))
        synced_id = sdk.weight_sync(
            job_id, f"{job_id}:training:0", [f"{job_id}:sampling:0"], weight_format="lora"
        )
        synced = sdk.poll_request(job_id, synced_id)
        assert synced["bytes_sent"] > 0
        scores = [
            sdk.poll_request(job_id, sdk.fwd(job_id, frame(probe), sub_job_type=kind)["request_id"])[
                "logprobs"
            ]
            for kind in ("training", "sampling")
        ]
        torch.testing.assert_close(scores[0], scores[1], rtol=0, atol=1e-4)
        # Logs: one page, then all of it without following.
        page = sdk.tail_logs(job_id, sub_job_id=f"{job_id}:training:0", max_lines=1)
        assert len(page["entries"]) == 1 and page["next_cursor"]
        lines = [entry["line"] for entry in sdk.stream_logs(job_id, sub_job_type="training", follow=False)]
        assert any("forward_backward=2" in line for line in lines)
        # An ordinary job: %cortex jobs (connected over TLS with a pinned certificate), our client and
        # the SDK's list all show it.
        frame_ = _cortex_jobs(cortex_shell, tls_backend, backend)
        row = frame_.set_index("job_id").loc[job_id]
        # Its one word in %cortex jobs: running with nothing queued, it is idle, counting down to freeing its device.
        assert (
            row["labels"] == f"api=cortex-training, database={DATABASE}, schema={SCHEMA}"
            and row["status"] == "idle"
        )
        assert row["detail"].startswith("freeing the device in ")
        assert ours.get_job(job_id)["labels"]["database"] == DATABASE
        listed = {j["job_id"]: j for j in sdk.list_jobs(status="running")}
        assert listed[job_id]["experiment_name"] == "sdk-demo" and listed[job_id]["database"] == DATABASE
        capacity = sdk.get_capacity()
        assert capacity["in_use_gpus"] >= 2 and capacity["max_total_gpus"] == 4
        done = sdk.cancel_request(job_id, synced_id)  # a finished request stays finished
        assert done["status"] == "done"
    finally:
        sdk.cancel_job(job_id)
    assert sdk.get_job(job_id)["status"] == "cancelled"
    with pytest.raises(RuntimeError, match="cancelled"):
        sdk.wait_for_job(job_id)


def _cortex_jobs(shell, tls_backend, backend):
    """`%cortex jobs` in a notebook shell connected to the TLS backend; the shell is connected back after."""
    import os

    from .notebook_fixtures import run_cell

    try:
        os.environ["CORTEX_TEST_TLS_TOKEN"] = tls_backend.token
        connected = run_cell(
            shell,
            f"%cortex connect {tls_backend.url} --token-env CORTEX_TEST_TLS_TOKEN"
            f" --verify {tls_backend.fingerprint}",
        )
        assert connected.success and "connected to https://" in connected.stdout, connected.stderr
        listed = run_cell(shell, "%cortex jobs")
        assert listed.success, listed.stderr
        return listed.result
    finally:
        os.environ["CORTEX_TEST_TLS_TOKEN"] = backend.token
        run_cell(shell, f"%cortex connect {backend.url} --token-env CORTEX_TEST_TLS_TOKEN")
        del os.environ["CORTEX_TEST_TLS_TOKEN"]


def test_an_unhinted_forward_scores_the_trainers_live_weights(sdk):
    """`fwd_no_grad` without a routing hint on a job with a log-probability sub-job scores the trainer (what the
    SDK's users mean), not the scorer, whose weights stay those of before training until a weight sync."""
    trainer = SubJobConfig.training_job(
        "tiny",
        optimizer={"name": "AdamW", "lr": 5e-2},
        max_seq_len=128,
        train_batch_size=2,
        n_gpus=1,
        seed=1,
        extra_training={"peft_config": LORA},
    )
    scorer = SubJobConfig.sampling_job(
        "tiny",
        max_seq_len=128,
        n_gpus=1,
        job_type=JobType.LOG_PROBABILITY,
        extra_sampling={"peft_config": LORA},
    )
    job_id = sdk.create_job([trainer, scorer], idle_timeout_seconds=0)
    rng = np.random.default_rng(4)
    probe = frame(sdk_batch(rng, batch=1, length=10))
    try:
        sdk.wait_for_job(job_id)
        for _ in range(2):
            sdk.poll_request(job_id, sdk.forward_backward(job_id, frame(sdk_batch(rng))))
            sdk.poll_request(job_id, sdk.step(job_id))

        def scores(**hint):
            return sdk.poll_request(job_id, sdk.fwd_no_grad(job_id, probe, **hint)["request_id"])["logprobs"]

        unhinted, trained, stale = (
            scores(),
            scores(sub_job_type="training"),
            scores(sub_job_type="log_probability"),
        )
        torch.testing.assert_close(unhinted, trained, rtol=0, atol=0)
        assert not torch.allclose(unhinted, stale, atol=1e-4), (
            "the scorer was never synced, so it must differ"
        )
    finally:
        sdk.cancel_job(job_id)
