"""Router replay end to end on a tiny random Mixtral registered with --model: a sampler records the routes of
its samples, the trainer (whose LoRA-adapted routers and attention moved with a few steps) replays them in
forward_backward and forward: the experts it used are exactly the sampled ones (free routing differs), and its
logprobs are those of an in-process peft model with the exported adapter under `replaying_routes`. The Cortex
SDK's bootstrap_router_replay and router_replay_discard drive the same thing; a dense base, a routes id the job
does not hold, rows that do not fit and a full cache are refused with their codes."""

from __future__ import annotations

import numpy as np
import pytest
import requests
import torch
from cortex_backend.engine.router_replay import RecordedRoutes, recording_routes, replaying_routes, routes_of
from cortex_training import CortexTrainingClient
from cortex_training import wire as sdk_wire
from peft import PeftModel
from transformers import AutoModelForCausalLM

from cortex_nb import Client
from cortex_nb.errors import CortexError

from .backend_process import start_backend
from .model_factory import build_mixtral_dir

MODEL = "tiny-mixtral"
LORA = {"r": 8, "alpha": 16}  # all-linear: on Mixtral also the routers and the fused experts
PROMPTS = [[5, 17, 42, 99], [7, 8, 250, 31, 64, 12], [300, 2, 2]]

pytestmark = pytest.mark.filterwarnings(
    "ignore::urllib3.exceptions.InsecureRequestWarning",
    "ignore:The 'initial' parameter is deprecated:DeprecationWarning",
)


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory):
    return build_mixtral_dir(tmp_path_factory.mktemp("models") / MODEL)


@pytest.fixture(scope="module")
def moe_backend(tmp_path_factory, mixtral_dir):
    process = start_backend(
        tmp_path_factory.mktemp("moe-backend"),
        "--tls",
        "self-signed",
        "--model",
        f"{MODEL}={mixtral_dir}",
        "--devices",
        "cpu:4",
        "--worker-threads",
        "1",
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(moe_backend):
    with Client(moe_backend.url, moe_backend.token, verify=moe_backend.fingerprint) as client:
        yield client


def moe_job(client: Client, base: str = MODEL) -> str:
    sub = {"base_model": base, "lora": LORA, "seed": 4, "max_seq_len": 64}
    job = client.create_job(
        [{**sub, "type": "training", "optimizer": {"lr": 0.05}}, {**sub, "type": "sampling"}]
    )
    client.wait_for_job(job["job_id"], timeout_s=120)
    return job["job_id"]


def sampled(client: Client, job_id: str, **extra) -> list[dict]:
    request = client.api.generate(
        job_id,
        PROMPTS,
        {"max_tokens": 6, "temperature": 1.0, "seed": 3, "ignore_eos": True, **extra},
        sub_job="sampling-0",
    )["request_id"]
    return client.poll_request(job_id, request, 120)["samples"]


def batch_of(samples: list[dict]) -> tuple[dict[str, np.ndarray], list[list[int]]]:
    """Each sample's sequence (prompt then sample) as a right-padded row, trained on its sampled tokens."""
    sequences = [PROMPTS[s["prompt_index"]] + s["tokens"] for s in samples]
    length = max(len(seq) for seq in sequences) - 1
    batch = {
        "input_ids": np.zeros((len(samples), length), np.int64),
        "attention_mask": np.zeros((len(samples), length), np.int64),
        "target_tokens": np.zeros((len(samples), length), np.int64),
        "weights": np.zeros((len(samples), length), np.float32),
    }
    for row, (sample, seq) in enumerate(zip(samples, sequences, strict=True)):
        n = len(seq) - 1
        batch["input_ids"][row, :n] = seq[:-1]
        batch["attention_mask"][row, :n] = 1
        batch["target_tokens"][row, :n] = seq[1:]
        batch["weights"][row, len(PROMPTS[sample["prompt_index"]]) - 1 : n] = 1
    return batch, [seq[:-1] for seq in sequences]


def recorded(model: torch.nn.Module, rows: list[list[int]]) -> list[torch.Tensor]:
    """Per row, the (layers, tokens, top_k) experts an in-process forward routes it to."""
    out = []
    with torch.no_grad():
        for row in rows:
            with recording_routes(model) as calls:
                model(input_ids=torch.tensor([row]))
            out.append(torch.stack([layer[0].long() for layer in routes_of(calls).experts]))
    return out


def backend_rows(routed: np.ndarray, rows: list[list[int]]) -> list[torch.Tensor]:
    """The backend's (layers, batch, tokens, top_k) `routed_experts`, cut to each row's real tokens."""
    return [torch.from_numpy(routed[:, i, : len(row)]).long() for i, row in enumerate(rows)]


def test_the_trainer_replays_the_sampled_experts_after_its_routing_moved(client, mixtral_dir, tmp_path):
    job_id = moe_job(client)
    try:
        samples = sampled(client, job_id, record_routes=True)
        assert all(s["routes_id"].startswith("rr-") for s in samples)
        batch, rows = batch_of(samples)
        base = AutoModelForCausalLM.from_pretrained(mixtral_dir, dtype=torch.float32).eval()
        sampled_routes = recorded(base, rows)  # the sampler's adapter starts as the identity

        # A few steps on other data move the trainer's routers (all-linear adapts them) and their inputs.
        rng = np.random.default_rng(0)
        for _ in range(4):
            tokens = rng.integers(0, 300, size=(2, 16))
            client.forward_backward(
                job_id,
                {
                    "input_ids": tokens,
                    "target_tokens": np.roll(tokens, -1, axis=1),
                    "weights": np.ones(tokens.shape, np.float32),
                },
            )
            client.step(job_id)
        client.poll_request(job_id, client.save(job_id, checkpoint_id="moved"), 120)
        adapter = client.export_checkpoint(job_id, "moved", tmp_path / "adapter")
        trained = PeftModel.from_pretrained(base, adapter).eval()

        free = client.poll_request(
            job_id, client.forward(job_id, batch, record_routes=True, sub_job="training-0"), 120
        )
        free_routes = backend_rows(free["tensors"]["routed_experts"], rows)
        for ours, theirs in zip(free_routes, recorded(trained, rows), strict=True):
            assert torch.equal(ours, theirs)  # free routing is the trained model's own
        assert any(not torch.equal(a, b) for a, b in zip(free_routes, sampled_routes, strict=True))

        ids = [s["routes_id"] for s in samples]
        replayed = client.poll_request(
            job_id,
            client.forward_backward(job_id, batch, router_replay=ids, record_routes=True),
            120,
        )
        assert replayed["router_replay"] == {"layers": 2, "rows": len(samples)}
        for ours, theirs in zip(
            backend_rows(replayed["tensors"]["routed_experts"], rows), sampled_routes, strict=True
        ):
            assert torch.equal(ours, theirs)  # exactly the sampled experts

        # The logprobs are those of the trained model with the sampled routes forced, row by row in process.
        scored = client.poll_request(job_id, client.forward(job_id, batch, router_replay=ids), 120)
        with torch.no_grad():
            for i, (row, routes) in enumerate(zip(rows, sampled_routes, strict=True)):
                forced = RecordedRoutes([layer[None].to(torch.int16) for layer in routes])
                with replaying_routes(trained, forced):
                    logits = trained(input_ids=torch.tensor([row])).logits[0]
                expected = torch.log_softmax(logits, -1).gather(
                    -1, torch.from_numpy(batch["target_tokens"][i, : len(row)])[:, None]
                )[:, 0]
                counted = batch["weights"][i, : len(row)] > 0  # forward scores the weighted positions only
                np.testing.assert_allclose(
                    scored["tensors"]["logprobs"][i, : len(row)][counted],
                    expected.numpy()[counted],
                    atol=1e-4,
                )
                np.testing.assert_allclose(
                    replayed["tensors"]["logprobs"][i, : len(row)], expected.numpy(), atol=1e-4
                )
                free_logits = trained(input_ids=torch.tensor([row])).logits[0]
                assert not torch.allclose(free_logits, logits, atol=1e-3)

        # Rows that are not the sampled sequences, or a routes id the job does not hold, are refused.
        shifted = {**batch, "input_ids": np.roll(batch["input_ids"], 1, axis=1)}
        with pytest.raises(CortexError) as mismatch:
            client.forward_backward(job_id, shifted, router_replay=ids)
        assert mismatch.value.code == "router_replay_mismatch" and "the row's token" in str(mismatch.value)
        with pytest.raises(CortexError) as short:
            client.forward_backward(job_id, batch, router_replay=ids[:1])
        assert short.value.code == "router_replay_mismatch"
        with pytest.raises(CortexError) as unknown:
            client.forward_backward(job_id, batch, router_replay=["rr-0000", *ids[1:]])
        assert unknown.value.code == "unknown_routes" and unknown.value.status == 400

        # Discarding frees them; naming them afterwards is an unknown id.
        discarded = client.router_replay_discard(job_id, ids[:1])
        assert discarded["discarded"] == 1 and discarded["freed_bytes"] > 0
        with pytest.raises(CortexError) as gone:
            client.forward_backward(job_id, batch, router_replay=ids)
        assert gone.value.code == "unknown_routes"
    finally:
        client.cancel_job(job_id)


def test_a_dense_base_is_refused_with_the_reason(client, sdk):
    job_id = moe_job(client, "tiny")
    try:
        with pytest.raises(requests.HTTPError) as caught:
            sdk.bootstrap_router_replay(job_id, f"{job_id}:sampling:0", f"{job_id}:training:0")
        assert caught.value.response.status_code == 400
        assert caught.value.response.json()["error"]["code"] == "router_replay_unsupported"
        with pytest.raises(CortexError) as refused:
            client.api.generate(job_id, [[1, 2, 3]], {"max_tokens": 2, "record_routes": True})
        assert refused.value.code == "router_replay_unsupported" and refused.value.status == 400
        assert "dense model with no MoE router" in str(refused.value)
        with pytest.raises(CortexError) as named:
            client.forward_backward(
                job_id,
                {
                    "input_ids": np.array([[1, 2, 3]]),
                    "target_tokens": np.array([[2, 3, 4]]),
                    "weights": np.ones((1, 3), np.float32),
                },
                router_replay=["rr-0000"],
            )
        assert named.value.code == "router_replay_unsupported"
    finally:
        client.cancel_job(job_id)


@pytest.fixture(scope="module")
def sdk(moe_backend):
    """The published SDK as a user makes it (requests lets *_CA_BUNDLE override verify=False: kept out)."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
            patch.delenv(name, raising=False)
        client = CortexTrainingClient.from_pat(
            moe_backend.url.removeprefix("https://"), moe_backend.token, "DB", "PUBLIC", verify_ssl=False
        )
        yield client
        client.close()


def test_bootstrap_and_discard_through_the_cortex_sdk(client, sdk):
    job_id = moe_job(client)
    try:
        ready = sdk.bootstrap_router_replay(
            job_id, f"{job_id}:sampling:0", f"{job_id}:training:0", max_cache_bytes=64 * 1024
        )
        assert ready["status"] == "ready" and ready["max_cache_bytes"] == 64 * 1024
        assert ready["target_sub_job_id"] == f"{job_id}:training:0"
        # The SDK's own generate: every sample of the bootstrapped sampler carries the id of its routes.
        request_id = sdk.generate(job_id, PROMPTS, {"max_tokens": 6, "seed": 3, "ignore_eos": True})
        samples = sdk.poll_request(job_id, request_id)["results"]
        sample_ids = [s["sample_id"] for s in samples]
        assert len(sample_ids) == len(PROMPTS) and all(i.startswith("rr-") for i in sample_ids)

        # A forward_backward frame naming them in its op metadata replays them.
        ours = [{"prompt_index": s["prompt_index"], "tokens": s["token_ids"]} for s in samples]
        batch, rows = batch_of(ours)
        labels = np.where(batch["weights"] > 0, batch["target_tokens"], -100)
        frame = sdk_wire.dumps(
            {
                "args": (),
                "kwargs": {
                    "input_ids": torch.from_numpy(batch["input_ids"]),
                    "attention_mask": torch.from_numpy(batch["attention_mask"]),
                    "labels": torch.from_numpy(labels),
                },
            },
            metadata={"router_replay": {"sample_ids": sample_ids}},
        )
        trained = sdk.poll_request(job_id, sdk.forward_backward(job_id, frame))
        assert trained["loss"] > 0
        logged = client.list_requests(job_id)
        replay_row = next(r for r in logged if r["op"] == "forward_backward")
        assert replay_row["status"] == "succeeded"
        assert client.get_request_status(job_id, replay_row["request_id"])["result"]["router_replay"] == {
            "layers": 2,
            "rows": len(PROMPTS),
        }

        # The SDK's forward (fwd_no_grad) takes the same frame and replays too.
        scored = sdk.poll_request(job_id, sdk.forward(job_id, frame)["request_id"])
        assert np.asarray(scored["logprobs"]).shape == batch["input_ids"].shape
        forwarded = next(r for r in client.list_requests(job_id) if r["op"] == "forward")
        assert client.get_request_status(job_id, forwarded["request_id"])["result"]["router_replay"] == {
            "layers": 2,
            "rows": len(PROMPTS),
        }

        discarded = sdk.router_replay_discard(job_id, sample_ids[:2])
        assert discarded["discarded"] == 2 and discarded["held_bytes"] > 0
        everything = sdk.router_replay_discard(job_id)
        assert everything["discarded"] == 1 and everything["held_bytes"] == 0

        # A cap smaller than one generate's routes: the generate fails with the cap's code, nothing is kept.
        sdk.bootstrap_router_replay(
            job_id, f"{job_id}:sampling:0", f"{job_id}:training:0", max_cache_bytes=100
        )
        request_id = client.api.generate(job_id, PROMPTS, {"max_tokens": 6, "seed": 3}, sub_job="sampling-0")[
            "request_id"
        ]
        status = client.get_request_status(job_id, request_id)
        while status["status"] not in ("succeeded", "failed", "cancelled"):
            status = client.get_request_status(job_id, request_id, wait_s=5)
        assert status["status"] == "failed" and status["error"]["code"] == "router_replay_cache_full"
        assert sdk.router_replay_discard(job_id)["held_bytes"] == 0
    finally:
        client.cancel_job(job_id)
