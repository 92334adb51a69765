"""Quantized bases (QLoRA): the base held in NF4 or int8 (torchao on this CPU), the adapter in fp32.

What must hold: the quantized base stays close to the full-precision one, it takes less memory, a LoRA trains on
it, a checkpoint resumes bitwise, samplers of the base run the adapter unmerged and agree with the trainer, and
an exported adapter loads with plain peft onto the full-precision base."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cortex_nb import Client
from cortex_nb.views import quantized_models_line

from .backend_process import start_backend
from .training_data import random_batches, text_batch, train

TINY_VOCAB = 259
GREEDY = {"max_tokens": 12, "temperature": 0.0}
PROMPTS = [[256, 116, 104, 101], [256, 115, 97]]


def quantized_state(kind: str | None):
    from cortex_backend.engine.model_state import ModelState
    from cortex_backend.models import TINY, TINY_CONFIG, ModelInfo

    info = ModelInfo(TINY, "builtin", None, dict(TINY_CONFIG), kind)
    return ModelState(info, {"lora": {"r": 8, "alpha": 16}, "seed": 3})


def relative_error(logits: torch.Tensor, reference: torch.Tensor) -> float:
    return float((logits - reference).pow(2).mean().sqrt() / reference.pow(2).mean().sqrt())


def test_a_quantized_base_is_close_to_full_precision_and_smaller():
    ids = torch.from_numpy(random_batches(1, TINY_VOCAB, rows=2, length=24, seed=1)[0]["input_ids"])
    states = {kind: quantized_state(kind) for kind in (None, "int8", "nf4")}
    logits = {}
    for kind, state in states.items():
        with state.inference():
            logits[kind] = state.model(input_ids=ids).logits
    # Stated in docs/models.md: the relative RMS error of the logits (tiny's random weights are harder to
    # quantize than trained ones, whose weights are closer to normal).
    assert relative_error(logits["int8"], logits[None]) < 0.02
    assert relative_error(logits["nf4"], logits[None]) < 0.3
    assert relative_error(logits["nf4"], logits[None]) > 0, "nf4 must really have quantized the weights"
    base = {kind: state.describe()["base_bytes"] for kind, state in states.items()}
    # The head and embeddings stay fp32 (a third of tiny's weights); the linear layers shrink 4x and ~7x.
    assert base["nf4"] < base["int8"] < 0.5 * base[None]
    assert states["nf4"].describe()["quantization"] == "nf4"
    # The adapter is full precision and trainable; the quantized weights are frozen.
    trainable = [p for p in states["nf4"].model.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)


@pytest.fixture(scope="module")
def quantized_backend(tmp_path_factory, llama_dir):
    process = start_backend(
        tmp_path_factory.mktemp("quantized"),
        "--model",
        f"q-llama={llama_dir}",
        "--quantize",
        "q-llama=nf4",
        "--quantize",
        "tiny=int8",
        "--devices",
        "cpu:4",
        "--worker-threads",
        "1",
    )
    yield process
    process.stop()


@pytest.fixture
def quantized_client(quantized_backend):
    with Client(quantized_backend.url, quantized_backend.token) as client:
        yield client


def test_models_and_jobs_say_how_the_base_is_held(quantized_client):
    models = {model["name"]: model for model in quantized_client.list_models()}
    assert models["tiny"]["quantization"] == "int8"
    assert models["q-llama"]["quantization"] == "nf4"
    # Capacity names them too, and %cortex capacity and the sidebar say so in one line.
    capacity = quantized_client.get_capacity()
    assert capacity["quantized_models"] == {"q-llama": "nf4", "tiny": "int8"}
    assert quantized_models_line(capacity) == "quantized bases: q-llama nf4, tiny int8"
    with quantized_client.create_training_job("q-llama", lora={"r": 4}) as job:
        info = job.info["sub_jobs"][0]["info"]
        assert info["quantization"] == "nf4" and info["base_bytes"] > 0


def test_lora_trains_resumes_bitwise_and_samples_on_a_quantized_base(quantized_client, tmp_path):
    client = quantized_client
    spec = {"lora": {"r": 8, "alpha": 16}, "optimizer": {"lr": 5e-3}, "seed": 5}
    batch = text_batch()
    batches = random_batches(6, TINY_VOCAB, seed=3)
    with (
        client.create_training_job("tiny", **spec) as first,
        client.create_training_job("tiny", **spec) as straight,
    ):
        losses = train(first, [batch] * 8)
        assert losses[-1] < 0.5 * losses[0], f"the loss must fall on a quantized base: {losses}"
        first.save("q").result()
        straight_losses = train(straight, [batch] * 8 + batches)
        with client.create_training_job("tiny", **spec) as resumed:
            assert resumed.load("q", source_job_id=first.job_id).result()["step"] == 8
            assert train(resumed, batches) == straight_losses[8:]

        # A sampling job of the quantized base runs the adapter unmerged and samples what the trainer does.
        with client.create_sampler("tiny", lora={"r": 8, "alpha": 16}) as sampler:
            engine = sampler.info["sub_jobs"][0]["info"]["sampler"]
            assert engine == {**engine, "engine": "transformers", "lora": "unmerged"}
            from_checkpoint = sampler.generate(
                PROMPTS, adapter={"job_id": first.job_id, "checkpoint_id": "q"}, **GREEDY
            ).result()
        assert from_checkpoint.tokens == first.generate(PROMPTS, **GREEDY).result().tokens

        probe = random_batches(1, TINY_VOCAB, rows=2, length=16, seed=9)[0]
        served = first.forward(probe).result()["tensors"]["logprobs"]
        exported = first.export(tmp_path / "adapter")

    # The adapter loads with plain peft onto the full-precision base; it scores close to the quantized base
    # it was trained on (docs/models.md states the expected difference).
    from peft import PeftModel

    from .reference import reference_base, reference_logprobs

    model = PeftModel.from_pretrained(reference_base("tiny"), str(exported)).eval()
    with torch.no_grad():
        full_precision = reference_logprobs(model, probe).numpy()
    difference = np.abs(full_precision - served)
    assert difference.max() < 0.5 and difference.mean() < 0.05


def test_lora_trains_on_an_nf4_local_model(quantized_client):
    with quantized_client.create_training_job(
        "q-llama", lora={"r": 4}, optimizer={"lr": 3e-2}, seed=1
    ) as job:
        vocab = next(m for m in quantized_client.list_models() if m["name"] == "q-llama")["vocab_size"]
        batch = random_batches(1, vocab, rows=2, length=12, seed=4)[0]
        losses = train(job, [batch] * 6)
    assert losses[-1] < losses[0]
