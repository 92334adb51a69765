"""Registered model names may hold one '/', so Hugging Face names work as they are; they stay names, never paths."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from cortex_nb import Client
from cortex_nb.errors import BadRequestError
from cortex_nb.protocol.model_names import is_model_name

HF_NAME = "cortex-test/tiny-llama"


def test_a_name_with_one_slash_is_listed_tokenized_and_trained(client: Client, llama_dir):
    from tokenizers import Tokenizer

    assert HF_NAME in [model["name"] for model in client.list_models()]
    # The route segment is percent-encoded by the client and decoded by the backend.
    expected = Tokenizer.from_file(str(llama_dir / "tokenizer.json")).encode("the quick brown fox").ids
    assert client.tokenize(HF_NAME, ["the quick brown fox"]) == [expected]
    job = client.create_training_job(HF_NAME, lora={"r": 4}, seed=1)
    try:
        assert job.refresh()["sub_jobs"][0]["base_model"] == HF_NAME
        result = job.generate(["the quick"], max_tokens=4, temperature=0.0, ignore_eos=True).result()
        assert len(result.tokens[0]) == 4
    finally:
        job.cancel()


@pytest.mark.parametrize(
    "name", ["a/b/c", "/etc/passwd", "x/", "a//b", "org/../x", "../x", "tiny\n", "a/b\n"]
)
def test_paths_and_second_slashes_are_not_names(client: Client, name: str):
    assert not is_model_name(name)
    with pytest.raises(BadRequestError) as caught:
        client.create_training_job(name)
    assert caught.value.code == "invalid_model_name"


def test_an_unregistered_hugging_face_name_is_unknown_and_never_fetched(backend):
    response = httpx.post(
        f"{backend.url}/v1/jobs",
        headers={"Authorization": f"Bearer {backend.token}"},
        json={"sub_jobs": [{"type": "sampling", "base_model": "Qwen/Qwen3-0.6B"}]},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unknown_model" and HF_NAME in error["message"]


def test_the_backend_refuses_to_register_a_path_like_name(tmp_path, gpt2_dir):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cortex_backend",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path),
            "--model",
            f"org/sub/model={gpt2_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "org/sub/model" in result.stderr and "at most one '/'" in result.stderr


def test_a_tied_output_layer_is_a_module_lora_can_target(gpt2_dir, llama_dir):
    """GPT-2 saves its output layer only as the input embedding (tied); LoRA can still adapt `lm_head`
    (Tinker's train_unembed), so a job naming it is not refused."""
    from cortex_backend.models import inspect_model_dir

    assert "lm_head" in inspect_model_dir("g", gpt2_dir).module_names
    assert "lm_head" in inspect_model_dir("l", llama_dir).module_names  # untied: saved as its own weight
