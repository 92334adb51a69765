"""Only registered local directories load, and only safely: safetensors, no remote code."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from cortex_backend.models import ModelCatalog, inspect_model_dir


def _serve(tmp_path, *args):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cortex_backend",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_pickle_only_directory_is_refused(tmp_path, gpt2_dir):
    pickled = tmp_path / "pickled"
    shutil.copytree(gpt2_dir, pickled)
    for weights in pickled.glob("*.safetensors"):
        weights.rename(weights.with_suffix(".bin"))
    with pytest.raises(ValueError, match="safetensors"):
        inspect_model_dir("pickled", pickled)
    result = _serve(tmp_path, "--model", f"pickled={pickled}")
    assert result.returncode == 2 and "pickle checkpoints are never loaded" in result.stderr
    assert "Traceback" not in result.stderr


def test_remote_code_is_refused(tmp_path, gpt2_dir):
    remote = tmp_path / "remote"
    shutil.copytree(gpt2_dir, remote)
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (remote / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="remote code"):
        inspect_model_dir("remote", remote)


def test_names_must_be_plain_and_tiny_is_reserved(tmp_path, gpt2_dir):
    for name in ("tiny", "../x", "a/b/c", "/b", "a/", ""):  # one "/" is allowed (Qwen/Qwen3-0.6B)
        with pytest.raises(ValueError):
            inspect_model_dir(name, gpt2_dir)
    catalog = ModelCatalog({"small": gpt2_dir})
    assert catalog.names() == ["small", "tiny"]
    assert catalog.tokenizer("small").encode("the quick") == catalog.tokenizer("small").encode("the quick")
