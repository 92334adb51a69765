"""A training sub-job across devices (`n_gpus: 2`): two ranks with FSDP2 over gloo on CPU slots, each computing
its slice of every batch, train as one process does, save one adapter, report each rank's share and memory,
and fail together when one rank dies."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cortex_nb import BadRequestError, Client
from cortex_nb.demo_data import addition_problems
from cortex_nb.errors import RequestFailed

from .backend_process import start_backend
from .notebook_fixtures import wait_until
from .reference import ReferenceTrainer, reference_base, reference_lora
from .training_data import random_batches

TINY_VOCAB = 259
LORA = {"r": 8, "alpha": 16}
SEED = 3
LR = 1e-2


@pytest.fixture(scope="module")
def ranks_backend(tmp_path_factory):
    """Four CPU slots: a two-rank sub-job and a one-rank twin fit at once."""
    process = start_backend(
        tmp_path_factory.mktemp("ranks-backend"), "--devices", "cpu:4", "--worker-threads", "1"
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(ranks_backend) -> Client:
    with Client(ranks_backend.url, ranks_backend.token) as client:
        yield client


def _slots_in_use(client: Client) -> int:
    return client.get_capacity()["slots_in_use"]


def _slots_in_use_once_settled(client: Client, wait_s: float = 30.0) -> int:
    """Slots in use once an ended job's workers have exited (its slots free only then)."""
    deadline = time.monotonic() + wait_s
    while _slots_in_use(client) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _slots_in_use(client)


def test_two_ranks_train_as_one_process_does(client: Client, tmp_path):
    batches = random_batches(5, TINY_VOCAB, rows=2, length=24, seed=5)
    spec = {"lora": LORA, "optimizer": {"lr": LR}, "seed": SEED}
    reference = ReferenceTrainer(reference_lora(reference_base("tiny"), 8, 16, SEED), LR)
    with (
        client.create_training_job("tiny", **spec) as single,
        client.create_training_job("tiny", n_gpus=2, **spec) as ranked,
    ):
        info = ranked.info["sub_jobs"][0]["info"]
        assert info["sharding"] == {"strategy": "fsdp2", "world_size": 2, "rank": 0}
        assert [rank["rank"] for rank in info["ranks"]] == [0, 1]
        assert _slots_in_use(client) == 3
        for batch in batches:
            expected_loss, _ = reference.train_step(batch)
            one = single.forward_backward(batch).result()["loss"]
            two = ranked.forward_backward(batch).result()
            single.step().result()
            ranked.step().result()
            assert two["loss"] == pytest.approx(one, abs=1e-5)
            assert two["loss"] == pytest.approx(expected_loss, rel=1e-5)
            # Each rank computed one of the two datums, not the whole batch.
            assert [(r["rank"], r["datums"], r["tokens"]) for r in two["ranks"]] == [(0, 1, 24), (1, 1, 24)]
        one_dir = single.export(tmp_path / "single")
        two_dir = ranked.export(tmp_path / "ranked")
        one_weights = load_file(one_dir / "adapter_model.safetensors")
        two_weights = load_file(two_dir / "adapter_model.safetensors")
        assert set(two_weights) == set(one_weights)
        for name, value in one_weights.items():
            torch.testing.assert_close(two_weights[name], value, atol=1e-5, rtol=0)
        # The exported adapter is one whole peft adapter: plain peft loads it onto the base.
        from peft import PeftModel

        loaded = PeftModel.from_pretrained(reference_base("tiny"), str(two_dir))
        live = {name: p for name, p in reference.model.named_parameters() if "lora_" in name}
        for name, parameter in loaded.named_parameters():
            if "lora_" in name:
                torch.testing.assert_close(parameter, live[name], atol=1e-4, rtol=0)
        logs = "\n".join(line["line"] for line in ranked.logs()["lines"])
        assert "[rank 0]" in logs and "[rank 1]" in logs


def _padded_batch(lengths: list[int], length: int, seed: int) -> dict[str, np.ndarray]:
    """Datums of different lengths, right-padded: the attention mask says which positions are tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, TINY_VOCAB, (len(lengths), length))
    mask = (np.arange(length)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    return {
        "input_ids": ids * mask,
        "target_tokens": np.roll(ids, -1, axis=1) * mask,
        "weights": mask.astype(np.float32),
        "attention_mask": mask,
    }


def _policy_batch(batch: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """The batch as a PPO batch: sampler logprobs near the model's and advantages on the tokens."""
    rng = np.random.default_rng(seed)
    mask = batch["attention_mask"].astype(np.float32)
    return {
        "input_ids": batch["input_ids"],
        "target_tokens": batch["target_tokens"],
        "attention_mask": batch["attention_mask"],
        "logprobs": (-5.6 + 0.3 * rng.standard_normal(mask.shape)).astype(np.float32) * mask,
        "advantages": rng.standard_normal(mask.shape).astype(np.float32) * mask,
    }


def test_odd_batches_split_across_two_ranks_equal_one_process(client: Client, tmp_path):
    """3 datums and 1 datum on 2 ranks: each rank computes its slice (cut by tokens; a rank with no datum runs
    a zero-weight pass), and losses, metrics, logprobs, gradients and the adapter are one process's."""
    spec = {"lora": LORA, "optimizer": {"lr": LR}, "seed": SEED}
    three = _padded_batch([20, 4, 5], 24, seed=21)
    one_datum = _padded_batch([17], 24, seed=22)
    assert _slots_in_use_once_settled(client) == 0
    with (
        client.create_training_job("tiny", **spec) as single,
        client.create_training_job("tiny", n_gpus=2, **spec) as ranked,
    ):
        ranks = ranked.info["sub_jobs"][0]["info"]["ranks"]
        assert [rank["rank"] for rank in ranks] == [0, 1]
        for rank in ranks:  # each rank's own memory and shard, not rank 0's twice
            assert rank["peak_memory_bytes"] > 0 and rank["peak_memory_kind"] == "cpu_rss"
            assert rank["base_bytes"] > 0
        cases = [
            (three, "cross_entropy", None, [(1, 24), (2, 48)]),  # cut by tokens: 20 | 4 + 5
            (one_datum, "cross_entropy", None, [(1, 24), (0, 0)]),
            (_policy_batch(three, 5), "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}, None),
            (_policy_batch(one_datum, 6), "importance_sampling", None, None),
        ]
        for batch, loss_fn, config, shares in cases:
            one = single.forward_backward(batch, loss_fn, config).result()
            two = ranked.forward_backward(batch, loss_fn, config).result()
            assert "ranks" not in one
            assert two["loss"] == pytest.approx(one["loss"], abs=1e-4)
            assert set(two["metrics"]) == set(one["metrics"])
            for name, value in one["metrics"].items():
                assert two["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-5), name
            np.testing.assert_allclose(two["tensors"]["logprobs"], one["tensors"]["logprobs"], atol=1e-5)
            assert (
                sum(r["tokens"] for r in two["ranks"])
                == two["metrics"]["tokens:sum"]
                == batch["input_ids"].size
            )
            assert sum(r["datums"] for r in two["ranks"]) == len(batch["input_ids"])
            if shares is not None:
                assert [(r["datums"], r["tokens"]) for r in two["ranks"]] == shares
            stepped_one, stepped_two = single.step().result(), ranked.step().result()
            assert stepped_two["grad_norm"] == pytest.approx(stepped_one["grad_norm"], rel=1e-5)
            assert [r["rank"] for r in stepped_two["ranks"]] == [0, 1]
            assert all(r["peak_memory_bytes"] > 0 for r in stepped_two["ranks"])
        # Scoring splits too: the whole batch's logprobs and weighted sum, in order.
        for batch in (three, one_datum):
            scored_one, scored_two = single.forward(batch).result(), ranked.forward(batch).result()
            np.testing.assert_allclose(
                scored_two["tensors"]["logprobs"], scored_one["tensors"]["logprobs"], atol=1e-5
            )
            assert scored_two["loss:sum"] == pytest.approx(scored_one["loss:sum"], abs=1e-4)
            assert sum(r["datums"] for r in scored_two["ranks"]) == len(batch["input_ids"])
        one_weights = load_file(single.export(tmp_path / "single") / "adapter_model.safetensors")
        two_weights = load_file(ranked.export(tmp_path / "ranked") / "adapter_model.safetensors")
        for name, value in one_weights.items():
            torch.testing.assert_close(two_weights[name], value, atol=1e-5, rtol=0)

        # The job's device metrics read every rank's worker, each on its own (sampled every few seconds: a
        # fast machine gets here before the first sample).
        def per_rank_samples() -> list[dict]:
            samples = client.get_job_metrics(ranked.job_id)["samples"]
            return [sample for sample in samples if "job_ranks" in sample]

        wait_until(per_rank_samples, 60)
        per_rank = per_rank_samples()
        for sample in per_rank:
            assert [(r["sub_job_id"], r["rank"]) for r in sample["job_ranks"]] == [
                ("training-0", 0),
                ("training-0", 1),
            ]
            assert sample["job_ram_bytes"] == sum(r["ram_bytes"] for r in sample["job_ranks"])
        # Once both have loaded (a rank is read while it still starts too), each holds torch and the model.
        assert all(r["ram_bytes"] > 64 << 20 for r in per_rank[-1]["job_ranks"])
        assert not any("job_ranks" in sample for sample in client.get_job_metrics(single.job_id)["samples"])


def _custom_loss_frame(batch: dict[str, np.ndarray], seed: int, only_length: int | None = None) -> bytes:
    """A forward_backward frame with a custom loss (a graph as the Tinker SDK traces one): per datum
    -scale * sum(logprobs * advantages), with a `:mean` metric over datums. `only_length`: the loss first
    reshapes a datum's logprobs to that many tokens, so it fails on a datum of any other length."""
    from cortex_nb.protocol import wire

    inputs = [
        {"name": "logprobs", "rank": 1},
        {"name": "advantages", "rank": 1},
        {"name": "scale", "rank": 0},
    ]
    nodes = [
        {"op": "placeholder", "name": i["name"], "target": i["name"], "args": [], "kwargs": {}}
        for i in inputs
    ]
    logprobs = {"ref": "logprobs"}
    if only_length is not None:
        nodes.append(
            {
                "op": "call_function",
                "name": "exact",
                "target": "torch.reshape",
                "args": [logprobs, [only_length]],
                "kwargs": {},
            }
        )
        logprobs = {"ref": "exact"}
    for name, op, target, args in (
        ("product", "call_function", "operator.mul", [logprobs, {"ref": "advantages"}]),
        ("total", "call_function", "torch.sum", [{"ref": "product"}]),
        ("scaled", "call_function", "operator.mul", [{"ref": "total"}, {"ref": "scale"}]),
        ("loss", "call_function", "operator.neg", [{"ref": "scaled"}]),
        ("average", "call_method", "mean", [{"ref": "logprobs"}]),
    ):
        nodes.append({"op": op, "name": name, "target": target, "args": args, "kwargs": {}})
    output = {"tuple": [{"ref": "loss"}, {"dict": {"custom/logprob:mean": {"ref": "average"}}}]}
    nodes.append({"op": "output", "name": "output", "target": "output", "args": [output], "kwargs": {}})
    rng = np.random.default_rng(seed)
    rows = len(batch["input_ids"])
    tensors = {
        "input_ids": batch["input_ids"],
        "target_tokens": batch["target_tokens"],
        "attention_mask": batch["attention_mask"],
        "advantages": rng.standard_normal(batch["input_ids"].shape).astype(np.float32)
        * batch["attention_mask"],
        # a per-datum scalar travels as one value per position; the loss reads the first
        "scale": np.repeat(rng.uniform(0.5, 2.0, (rows, 1)), batch["input_ids"].shape[1], axis=1).astype(
            np.float32
        ),
    }
    custom = {"name": "policy", "inputs": inputs, "format": 1, "nodes": nodes}
    return wire.encode_frame(tensors, {"loss_fn": "custom", "custom_loss": custom})


def test_a_custom_loss_splits_across_two_ranks_as_one_process_computes_it(client: Client):
    """A custom loss sums over datums as the built-in ones do: split 20 | 4 + 5 tokens, its loss, its `:mean`
    metric over datums and its gradients are one process's."""
    from cortex_nb.futures import APIFuture
    from cortex_nb.protocol import wire

    spec = {"lora": LORA, "optimizer": {"lr": LR}, "seed": SEED}
    frame = _custom_loss_frame(_padded_batch([20, 4, 5], 24, seed=23), seed=7)
    headers = {"Content-Type": wire.FRAME_CONTENT_TYPE}
    assert _slots_in_use_once_settled(client) == 0
    with (
        client.create_training_job("tiny", **spec) as single,
        client.create_training_job("tiny", n_gpus=2, **spec) as ranked,
    ):
        results = []
        for job in (single, ranked):
            submitted = client.api.call(
                "forward_backward", {"job_id": job.job_id}, content=frame, headers=headers
            )
            results.append(
                APIFuture(client.api, job.job_id, submitted["request_id"], "forward_backward").result()
            )
        one, two = results
        assert [(r["datums"], r["tokens"]) for r in two["ranks"]] == [(1, 24), (2, 48)]
        assert two["loss"] == pytest.approx(one["loss"], abs=1e-4)
        assert set(two["metrics"]) == set(one["metrics"]) >= {"loss:sum", "custom/logprob:mean"}
        for name, value in one["metrics"].items():
            assert two["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-5), name
        assert ranked.step().result()["grad_norm"] == pytest.approx(
            single.step().result()["grad_norm"], rel=1e-5
        )


def test_a_loss_failing_on_one_ranks_slice_fails_the_request_on_every_rank(client: Client):
    """A custom loss that fails only on rank 1's datums (lengths 4 and 5, where rank 0's is 20) fails the
    request with rank 1's code and message instead of leaving rank 0 in a collective; the job then trains on."""
    from cortex_nb.futures import APIFuture
    from cortex_nb.protocol import wire

    batch = _padded_batch([20, 4, 5], 24, seed=24)
    frame = _custom_loss_frame(batch, seed=8, only_length=20)
    headers = {"Content-Type": wire.FRAME_CONTENT_TYPE}
    assert _slots_in_use_once_settled(client) == 0
    with client.create_training_job("tiny", n_gpus=2, lora=LORA, seed=SEED) as ranked:
        submitted = client.api.call(
            "forward_backward", {"job_id": ranked.job_id}, content=frame, headers=headers
        )
        with pytest.raises(RequestFailed) as failed:
            APIFuture(client.api, ranked.job_id, submitted["request_id"], "forward_backward").result(
                timeout_s=120
            )
        assert failed.value.code == "custom_loss_failed"
        assert "rank 1 of 2" in str(failed.value)
        after = ranked.forward_backward(batch).result(timeout_s=120)
        assert [r["datums"] for r in after["ranks"]] == [1, 2]
        ranked.step().result(timeout_s=120)


def test_a_training_run_across_two_ranks_trains_as_one_process_does(client: Client):
    """`n_gpus: 2` in a `%%cortex train` spec: the backend's loop runs on both ranks, to the same curve."""
    spec = {
        "base_model": "tiny",
        "data": addition_problems()[:40],
        "steps": 6,
        "batch_size": 4,
        "max_seq_len": 16,
        "optimizer": {"lr": 0.003},
        "lora": {"r": 4, "alpha": 8},
        "seed": 3,
    }
    one = client.train(spec, name="run-one-rank")
    two = client.train({**spec, "n_gpus": 2}, name="run-two-ranks")
    alone, ranked = one.wait(timeout_s=300), two.wait(timeout_s=300)
    assert alone["status"] == ranked["status"] == "done"
    assert ranked["sub_jobs"][0]["info"]["sharding"]["world_size"] == 2
    curve = [point["loss_per_token"] for point in ranked["progress"]["history"]]
    assert len(curve) == 6
    assert curve == pytest.approx([p["loss_per_token"] for p in alone["progress"]["history"]], rel=1e-5)
    assert ranked["progress"]["last_checkpoint"] == "final"


def test_a_resumable_checkpoint_of_two_ranks_resumes_on_two_ranks_and_on_one(client: Client):
    """Saved as one adapter with whole AdamW moments: two new ranks (each taking its shard) and one process
    continue from it alike, and as the job that saved it does."""
    batches = random_batches(4, TINY_VOCAB, rows=2, length=16, seed=8)
    spec = {"lora": LORA, "optimizer": {"lr": LR}, "seed": SEED}
    with client.create_training_job("tiny", n_gpus=2, **spec) as saver:
        for batch in batches[:2]:
            saver.forward_backward(batch).result()
            saver.step().result()
        checkpoint = saver.save("two-ranks").result()["checkpoint_id"]
        continued = []
        for batch in batches[2:]:
            continued.append(saver.forward_backward(batch).result()["loss"])
            saver.step().result()
    for n_gpus in (2, 1):
        assert _slots_in_use_once_settled(client) == 0
        with client.create_training_job("tiny", n_gpus=n_gpus, **spec) as resumed:
            loaded = resumed.load(checkpoint, source_job_id=saver.job_id).result()
            assert loaded["restored_optimizer"] is True and loaded["step"] == 2
            for batch, expected in zip(batches[2:], continued, strict=True):
                assert resumed.forward_backward(batch).result()["loss"] == pytest.approx(expected, abs=1e-5)
                resumed.step().result()


def test_weights_of_two_ranks_sync_to_a_one_device_sampler(client: Client, tmp_path):
    """The trainer's ranks gather the whole adapter; the sampler ends up holding exactly what the ranks
    trained. With one datum (rank 1 runs the zero-weight pass) that is bit for bit what one process trained
    (its state hash is the single-process trainer's); with two datums split across the ranks, the gradient is
    a sum in another order, so the adapter equals one process's to 1e-5, not bit for bit."""
    spec = {"lora": LORA, "optimizer": {"lr": LR}, "seed": SEED}
    batch = random_batches(1, TINY_VOCAB, rows=2, length=16, seed=4)[0]
    one_datum = {name: value[:1] for name, value in batch.items()}
    assert _slots_in_use_once_settled(client) == 0
    with client.create_training_job("tiny", **spec) as single:
        single.forward_backward(one_datum).result()
        single.step().result()
        single.save("one", checkpoint_type="weights-only").result()
        expected_hash = client.get_checkpoint(single.job_id, "one")["state_hash"]
        single.forward_backward(batch).result()
        single.step().result()
        one_weights = load_file(single.export(tmp_path / "single") / "adapter_model.safetensors")
    assert _slots_in_use_once_settled(client) == 0
    with client.create_training_job("tiny", n_gpus=2, samplers=1, **spec) as job:
        job.forward_backward(one_datum).result()
        job.step().result()
        result = job.sync_sampler().result()
        assert result["weight_version"] == 1
        assert result["source_hash"] == expected_hash
        assert [target["sub_job_id"] for target in result["targets"]] == ["sampling-0"]
        split = job.forward_backward(batch).result()
        assert [r["datums"] for r in split["ranks"]] == [1, 1]
        job.step().result()
        job.save("two", checkpoint_type="weights-only").result()
        result = job.sync_sampler().result()
        assert result["weight_version"] == 2
        assert result["source_hash"] == client.get_checkpoint(job.job_id, "two")["state_hash"]
        two_weights = load_file(job.export(tmp_path / "ranked") / "adapter_model.safetensors")
    assert set(two_weights) == set(one_weights)
    for name, value in one_weights.items():
        torch.testing.assert_close(two_weights[name], value, atol=1e-5, rtol=0)


def test_a_dead_rank_fails_the_sub_job_and_frees_every_slot(client: Client):
    assert _slots_in_use_once_settled(client) == 0
    ranked = client.create_training_job("tiny", n_gpus=2, lora=LORA, seed=SEED)
    ranks = ranked.info["sub_jobs"][0]["info"]["ranks"]
    pids = [rank["pid"] for rank in ranks]
    assert _slots_in_use(client) == 2
    ranked.forward_backward(random_batches(1, TINY_VOCAB, seed=1)[0]).result()
    os.kill(pids[1], signal.SIGKILL)
    job = client.wait_for_job(ranked.job_id, until=("failed",), timeout_s=60)
    assert job["failure_code"] == "worker_crashed"
    assert "rank 1 of 2" in job["failure_message"]
    assert _slots_in_use_once_settled(client) == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_sampling_across_devices_is_refused_with_the_reason(client: Client):
    with pytest.raises(BadRequestError) as refused:
        client.api.create_job([{"type": "sampling", "base_model": "tiny", "n_gpus": 2}])
    assert refused.value.code == "multi_gpu_sampling_unsupported"
    # The reason: tensor parallelism is vLLM's, and this backend samples with the built-in engine.
    assert "vLLM's tensor parallelism" in str(refused.value) and "transformers" in str(refused.value)


def test_more_ranks_than_slots_is_refused(client: Client):
    with pytest.raises(BadRequestError) as refused:
        client.api.create_job([{"type": "training", "base_model": "tiny", "n_gpus": 5}])
    assert refused.value.code == "exceeds_capacity"
    assert "n_gpus=5" in str(refused.value)


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_the_cortex_sdk_trains_across_two_ranks(tls_backend, monkeypatch):
    """The cortex-training SDK's `n_gpus=2` training sub-job is served: two ranks, one forward_backward whose
    loss is the in-process reference's."""
    from cortex_training import CortexTrainingClient, SubJobConfig

    from .test_cortex_sdk import LORA as SDK_LORA
    from .test_cortex_sdk import frame, our_batch, sdk_batch

    # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override verify=False; keep them out of the way.
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    sdk = CortexTrainingClient.from_pat(
        tls_backend.url.removeprefix("https://"), tls_backend.token, "TRAINING_DB", "PUBLIC", verify_ssl=False
    )
    try:
        config = SubJobConfig.training_job(
            "tiny",
            optimizer={"name": "AdamW", "lr": LR},
            max_seq_len=128,
            train_batch_size=4,
            n_gpus=2,
            seed=SEED,
            extra_training={"peft_config": SDK_LORA},
        )
        job_id = sdk.create_job([config], idle_timeout_seconds=0)
        job = sdk.wait_for_job(job_id)
        assert job["status"] == "running"
        assert job["sub_jobs"][0]["training_config"]["n_gpus"] == 2
        kwargs = sdk_batch(np.random.default_rng(11))
        result = sdk.poll_request(job_id, sdk.forward_backward(job_id, frame(kwargs)))
        reference = ReferenceTrainer(reference_lora(reference_base("tiny"), 8, 16, SEED), LR)
        expected, _ = reference.train_step(our_batch(kwargs))
        assert result["loss"] == pytest.approx(expected, rel=1e-5, abs=1e-5)
        sdk.cancel_job(job_id)
    finally:
        sdk.close()
