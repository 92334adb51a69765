"""Weight sync from the trainer to its samplers: the state hash, the delta codec, and the real service
moving weights (delta, full, fallbacks, queue order, corruption)."""

from __future__ import annotations

import hashlib
import struct

import httpx
import numpy as np
import pytest
import torch

from cortex_nb import BadRequestError, Client, RequestFailed
from cortex_nb.protocol.state_hash import state_hash

from .backend_process import start_backend
from .training_data import random_batches, text_batch, train

PROMPTS = ["the sampler", "what the", "learned. the"]
GREEDY = {"max_tokens": 24, "temperature": 0.0, "ignore_eos": True}
TINY_VOCAB = 259

# The state hash of GOLDEN_TENSORS, pinned. It changes only if the definition in docs/api.md changes
# (and then STATE_HASH_VERSION must change too: hashes are compared across processes and versions).
GOLDEN_DIGEST = "fa6f6f88fcf20a47dcaf239a74e40c3bb4d9ad89c3a7a680bfa35d4352f6b4f0"


def golden_tensors() -> dict[str, np.ndarray]:
    return {
        "layer.lora_B.weight": np.array([[1.5, -0.0, 2.0], [np.nan, -3.25, 1e-8]], dtype=np.float16),
        "layer.lora_A.weight": np.arange(4, dtype=np.float64).reshape(4, 1) / 3,
        "scalar": np.float32(7.0),
    }


def hash_as_documented(tensors: dict[str, np.ndarray]) -> str:
    """docs/api.md's definition, written out independently of cortex_nb.state_hash."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        encoded = name.encode("utf-8")
        values = np.asarray(tensors[name], dtype=np.float32)
        digest.update(struct.pack("<Q", len(encoded)) + encoded)
        digest.update(struct.pack("<Q", values.ndim) + b"".join(struct.pack("<Q", d) for d in values.shape))
        for value in values.reshape(-1).tolist():
            if value != value:
                digest.update(struct.pack("<I", 0x7FC00000))
            else:
                digest.update(struct.pack("<f", 0.0 if value == 0 else value))
    return digest.hexdigest()


def test_state_hash_golden_digest():
    assert state_hash(golden_tensors()) == GOLDEN_DIGEST
    assert hash_as_documented(golden_tensors()) == GOLDEN_DIGEST


def test_state_hash_is_fp32_canonical_and_name_sorted():
    tensors = golden_tensors()
    reordered = dict(reversed(list(tensors.items())))
    as_fp32 = {name: np.asarray(value, dtype=np.float32) for name, value in tensors.items()}
    assert state_hash(reordered) == state_hash(as_fp32) == GOLDEN_DIGEST
    flipped_zero = {**as_fp32, "layer.lora_B.weight": np.abs(as_fp32["layer.lora_B.weight"])}
    flipped_zero["layer.lora_B.weight"][0, 2] = 2.0
    assert state_hash(flipped_zero) != GOLDEN_DIGEST  # the -3.25 became 3.25: a real change
    renamed = {("x" + name): value for name, value in as_fp32.items()}
    assert state_hash(renamed) != GOLDEN_DIGEST
    reshaped = {**as_fp32, "layer.lora_A.weight": as_fp32["layer.lora_A.weight"].reshape(1, 4)}
    assert state_hash(reshaped) != GOLDEN_DIGEST
    one_ulp = {**as_fp32, "scalar": np.nextafter(np.float32(7.0), np.float32(8.0))}
    assert state_hash(one_ulp) != GOLDEN_DIGEST


def test_torch_and_numpy_hashes_agree():
    from cortex_backend.engine.adapter import tensor_hash

    tensors = {
        name: torch.from_numpy(np.asarray(v, dtype=np.float32)) for name, v in golden_tensors().items()
    }
    assert tensor_hash(tensors) == GOLDEN_DIGEST
    assert tensor_hash({name: t.to(torch.float64) for name, t in tensors.items()}) == GOLDEN_DIGEST


def test_delta_codec_chooses_the_smaller_encoding_and_refuses_damage():
    from cortex_backend.engine import weight_codec as codec

    generator = torch.Generator().manual_seed(0)
    base = {"a": torch.randn(64, 32, generator=generator), "b": torch.randn(16, 64, generator=generator)}
    new = {"a": base["a"] + 1e-3 * torch.randn(64, 32, generator=generator), "b": base["b"].clone()}
    new["b"][3, 5] += 0.25
    deltas = codec.delta_values(base, new)
    payload = codec.encode_delta(deltas)
    assert payload.encodings == {"dense": 1, "sparse": 1}  # every value of `a` changed, one of `b`
    decoded = codec.decode_delta(payload.data)
    assert all(torch.equal(decoded[name], deltas[name]) for name in deltas)
    result = codec.apply_delta(base, decoded)
    assert torch.equal(result["b"], new["b"])  # 0.25 is exact in fp16
    # fp16 rounding: within half an fp16 ulp of each delta, and never exact for random deltas.
    error = (result["a"] - new["a"]).abs()
    assert 0 < error.max() <= (new["a"] - base["a"]).abs().max() * 2**-11 + 1e-6
    full = codec.encode_full(new)
    assert len(full.data) > len(payload.data)
    assert all(torch.equal(codec.decode_full(full.data)[n], new[n]) for n in new)

    damaged = bytearray(payload.data)
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(codec.PayloadError):
        codec.decode_delta(bytes(damaged))
    with pytest.raises(codec.PayloadError):
        codec.delta_values(base, {"a": base["a"] + 1e6, "b": base["b"]})  # beyond fp16's range


# ---- through the real service -------------------------------------------------------------------


def greedy(job, sub_job: str) -> tuple[list[list[int]], int]:
    result = job.generate(PROMPTS, sub_job=sub_job, **GREEDY).result()
    return result.tokens, result.weight_version


def next_token_logprobs(job, sub_job: str, sequence: list[int]) -> np.ndarray:
    """log p(v | sequence[:t+1]) for every position t and every token v of `tiny`: [positions, vocab]."""
    inputs = np.array([sequence[:-1]] * TINY_VOCAB, dtype=np.int64)
    targets = np.repeat(np.arange(TINY_VOCAB, dtype=np.int64)[:, None], inputs.shape[1], axis=1)
    result = job.forward({"input_ids": inputs, "target_tokens": targets}, sub_job=sub_job).result()
    return result["tensors"]["logprobs"].T


def greedy_distributions(job, client, tokens: list[list[int]], sub_job: str) -> list[np.ndarray]:
    """Each prompt's next-token distributions at the positions where greedy decoding chose a token."""
    prompts = client.tokenize("tiny", PROMPTS)
    return [
        next_token_logprobs(job, sub_job, p + g)[len(p) - 1 :] for p, g in zip(prompts, tokens, strict=True)
    ]


def greedy_margins(distributions: list[np.ndarray], tokens: list[list[int]]) -> float:
    """The smallest lead of the chosen token over the best other token, over all greedy choices."""
    margins = []
    for logprobs, chosen in zip(distributions, tokens, strict=True):
        rows = np.arange(len(chosen))
        others = logprobs.copy()
        others[rows, chosen] = -np.inf
        margins.append((logprobs[rows, chosen] - others.max(axis=1)).min())
    return float(min(margins))


def test_sync_makes_the_sampler_generate_what_the_trainer_generates(client):
    with client.create_training_job("tiny", samplers=2, optimizer={"lr": 1e-2}, seed=11) as job:
        before, version = greedy(job, "sampling-0")
        assert version == 0
        train(job, [text_batch()] * 12)
        trained, trainer_version = greedy(job, "training-0")
        assert trainer_version == 12
        assert trained != before, (
            "training must change the greedy output, or equality after the sync proves nothing"
        )

        result = job.sync_sampler().result()
        assert result["path"] == "delta" and result["weight_version"] == 12
        assert [t["sub_job_id"] for t in result["targets"]] == ["sampling-0", "sampling-1"]
        for target in result["targets"]:
            assert target["path"] == "delta" and target["fallback_reason"] is None
            assert target["encodings"]["dense"] > 0
            assert target["bytes"] < target["raw_bytes"]  # zstd made it smaller
            assert target["result_hash"] != result["source_hash"]  # fp16 deltas are not exact...
            assert 0 < target["max_abs_error"] < 5e-4  # ...but close (lr 1e-2, 12 steps: changes below ~0.2)
        assert result["bytes"] == result["relayed_bytes"] == sum(t["bytes"] for t in result["targets"])

        # Greedy decoding must agree wherever the trainer's choice leads by more than twice what the
        # fp16 rounding moved any logprob. Measure both on the trainer's greedy continuations...
        trainer_view = greedy_distributions(job, client, trained, "training-0")
        sampler_view = greedy_distributions(job, client, trained, "sampling-0")
        deviation = max(float(np.abs(t - s).max()) for t, s in zip(trainer_view, sampler_view, strict=True))
        margin = greedy_margins(trainer_view, trained)
        assert 0 < deviation < 1e-2
        assert margin > 2 * deviation, (
            f"a near-tie (margin {margin:.2e} vs deviation {deviation:.2e}): choose other prompts"
        )
        # ...then the outputs must be the same, token for token, on every synced sampler.
        for sampler in ("sampling-0", "sampling-1"):
            assert greedy(job, sampler) == (trained, 12)

        exact = job.sync_sampler(targets=["sampling-0"], weight_format="full").result()
        assert exact["path"] == "full" and exact["targets"][0]["max_abs_error"] == 0.0
        assert exact["targets"][0]["result_hash"] == exact["source_hash"]
        exact_view = greedy_distributions(job, client, trained, "sampling-0")
        # The adapters are now bit-identical (the hashes above); the sampler computes with its LoRA merged into
        # its own weights (W + BA in one matmul), so its logprobs differ from the trainer's only by rounding.
        for t, s in zip(trainer_view, exact_view, strict=True):
            np.testing.assert_allclose(s, t, rtol=0, atol=1e-5)

        # No step since. sampling-0 holds the exact weights: its delta is all zeros, sent sparse, tiny.
        # sampling-1 holds the fp16-rounded ones: its delta is the rounding residue, and its error shrinks.
        again = job.sync_sampler().result()
        assert again["path"] == "delta"
        exact_target, rounded_target = again["targets"]
        assert exact_target["encodings"]["dense"] == 0 and exact_target["bytes"] < 2000
        assert exact_target["result_hash"] == again["source_hash"]
        assert rounded_target["max_abs_error"] < result["targets"][1]["max_abs_error"] / 100


def test_sync_keeps_each_sub_job_queue_order(client):
    with client.create_training_job("tiny", samplers=1, optimizer={"lr": 1e-2}, seed=2) as job:
        batches = random_batches(3, 256, seed=9)
        queued_before = job.generate(PROMPTS, sub_job="sampling-0", **GREEDY)
        steps = [(job.forward_backward(b), job.step()) for b in batches]
        sync = job.sync_sampler()
        queued_after = job.generate(PROMPTS, sub_job="sampling-0", **GREEDY)
        more = [(job.forward_backward(b), job.step()) for b in batches]
        trainer_after = job.generate(PROMPTS, sub_job="training-0", **GREEDY)
        assert queued_before.result().weight_version == 0
        assert sync.result()["weight_version"] == 3
        assert queued_after.result().weight_version == 3
        assert trainer_after.result().weight_version == 6
        assert [s.result()["step"] for _, s in steps + more] == [1, 2, 3, 4, 5, 6]


def test_sync_into_a_sampler_holding_other_weights_sends_the_full_tensors(client):
    with client.create_training_job("tiny", samplers=1, optimizer={"lr": 1e-2}, seed=4) as job:
        train(job, random_batches(2, 256, seed=1))
        old = job.save("two-steps", "weights-only").result()
        train(job, random_batches(2, 256, seed=2))
        loaded = job.load(old["checkpoint_id"], target_sub_job_id="sampling-0").result()
        assert loaded["weight_version"] == 2
        assert greedy(job, "sampling-0")[1] == 2
        result = job.sync_sampler().result()
        target = result["targets"][0]
        assert result["path"] == "full" and target["fallback_reason"].startswith("base_mismatch")
        assert target["base_hash"] == old["checkpoint"]["state_hash"]
        assert target["result_hash"] == result["source_hash"] and target["max_abs_error"] == 0.0
        assert greedy(job, "sampling-0") == greedy(job, "training-0")


def test_weight_sync_requests_are_validated(client, backend):
    with client.create_training_job("tiny", samplers=1, seed=0) as job:
        for body, code in [
            ({"format": "fp8"}, "invalid_field"),
            ({"targets": ["training-0"]}, "invalid_field"),
            ({"targets": ["sampling-7"]}, "invalid_field"),
            ({"targets": "sampling-0"}, "invalid_field"),
            ({"source": "sampling-0"}, "invalid_field"),
            ({"target": ["sampling-0"]}, "invalid_field"),
        ]:
            response = httpx.post(
                f"{client.url}/v1/jobs/{job.job_id}/weight_sync",
                json=body,
                headers={"Authorization": f"Bearer {backend.token}"},
            )
            assert response.status_code == 400, body
            assert response.json()["error"]["code"] == code, body
    lone = client.create_sampler("tiny")
    with lone, pytest.raises(BadRequestError) as refused:
        client.weight_sync(lone.job_id)
    assert refused.value.code == "unsupported_operation"
    narrow = client.create_job(
        [
            {"type": "training", "base_model": "tiny", "lora": {"r": 8}},
            {"type": "sampling", "base_model": "tiny", "lora": {"r": 4}},
        ]
    )
    try:
        client.wait_for_job(narrow["job_id"])
        with pytest.raises(BadRequestError) as incompatible:
            client.weight_sync(narrow["job_id"])
        assert incompatible.value.code == "incompatible_adapter"
    finally:
        client.cancel_job(narrow["job_id"])


def test_a_cancelled_sync_leaves_no_sampler_waiting(client):
    with client.create_training_job("tiny", samplers=1, seed=0) as job:
        long_generate = job.generate(
            ["x"], sub_job="training-0", max_tokens=300, temperature=0.0, ignore_eos=True
        )
        sync = job.sync_sampler()  # queued behind the long generate on the trainer
        sync.cancel()
        with pytest.raises(RequestFailed) as cancelled:
            sync.result()
        assert cancelled.value.code == "cancelled"
        # The sampler's side of the sync was cancelled too: its next request runs, with its old weights.
        assert greedy(job, "sampling-0")[1] == 0
        long_generate.result()


# ---- corruption, injected in a backend of its own ------------------------------------------------


@pytest.fixture(scope="module")
def faulty_backend(tmp_path_factory):
    process = start_backend(
        tmp_path_factory.mktemp("faulty"),
        "--devices",
        "cpu:8",
        "--worker-threads",
        "1",
        "--fault-injection",
        "corrupt_sync_delta=sampling-0",
        "--fault-injection",
        "corrupt_sync_base=sampling-1",
        "--fault-injection",
        "corrupt_sync_bytes=sampling-2",
    )
    yield process
    process.stop()


def test_corrupted_bases_and_deltas_are_caught_and_the_sync_still_succeeds(faulty_backend):
    with Client(faulty_backend.url, faulty_backend.token) as client:
        with client.create_training_job("tiny", samplers=4, optimizer={"lr": 2e-2}, seed=6) as job:
            train(job, [text_batch()] * 6)
            trained = greedy(job, "training-0")
            result = job.sync_sampler().result()
            assert result["path"] == "mixed"
            by_target = {t["sub_job_id"]: t for t in result["targets"]}
            # sampling-0 decoded a delta whose values were changed: the hash check refused it.
            assert by_target["sampling-0"]["path"] == "full"
            assert by_target["sampling-0"]["fallback_reason"].startswith(
                "delta_rejected: result hash mismatch"
            )
            # sampling-1's own weights were changed: its base matches nothing the trainer knows.
            assert by_target["sampling-1"]["path"] == "full"
            assert by_target["sampling-1"]["fallback_reason"].startswith("base_mismatch")
            # sampling-2 received damaged bytes: zstd's checksum refused them.
            assert by_target["sampling-2"]["path"] == "full"
            assert by_target["sampling-2"]["fallback_reason"].startswith(
                "delta_rejected: the payload does not decompress"
            )
            # sampling-3 is healthy.
            assert (
                by_target["sampling-3"]["path"] == "delta"
                and by_target["sampling-3"]["fallback_reason"] is None
            )
            for name in ("sampling-0", "sampling-1", "sampling-2"):
                target = by_target[name]
                assert target["result_hash"] == result["source_hash"] and target["max_abs_error"] == 0.0
                assert (
                    target["bytes"] > by_target["sampling-3"]["bytes"]
                )  # full tensors (after a rejected delta)
            for name in (
                "sampling-0",
                "sampling-1",
                "sampling-2",
            ):  # exact weights: exactly the trainer's output
                assert greedy(job, name) == trained
            assert greedy(job, "sampling-3")[1] == 6
            logs = "\n".join(line["line"] for line in client.tail_logs(job.job_id, limit=5000)["lines"])
            assert "Traceback" not in logs
