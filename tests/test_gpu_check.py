"""scripts/gpu-check cannot rot: its --dry-run runs every stage on the CPU at tiny sizes.

It runs in the vLLM venv when there is one (as in CI), so the vLLM rows run too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GPU_CHECK = REPO / "scripts" / "gpu-check"


def _python() -> tuple[str, bool]:
    """The Python to run the check with, and whether it has vLLM."""
    vllm = os.environ.get("CORTEX_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if Path(vllm).exists():
        return vllm, True
    if os.environ.get("CORTEX_REQUIRE_VLLM") == "1":
        pytest.fail(f"no Python with vLLM at {vllm}")
    return sys.executable, False


def test_dry_run_runs_every_stage_and_writes_its_record(tmp_path):
    python, with_vllm = _python()
    out = tmp_path / "gpu-check.json"
    done = subprocess.run(
        [python, str(GPU_CHECK), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["mode"] == "dry-run" and record["failed"] == []
    assert (
        record["nvml_before"]["available"] is False and record["nvml_before"]["reason"]
    )  # a CPU host says why
    (model,) = record["models"]
    checks, measures = model["checks"], model["measures"]
    parity = checks["training_parity"]
    assert parity["passed"] and len(parity["steps"]) == 2
    assert all(0 < step["relative_error"] < parity["tolerances"]["loss_relative"] for step in parity["steps"])
    assert checks["sampler_vs_trainer_transformers"]["passed"]
    assert checks["sampler_vs_trainer_transformers"]["exact"] == 3
    assert checks["service"]["exact"] == checks["service"]["prompts"] == 4
    assert checks["service"]["sampler_engine"] == "transformers"  # auto picks the built-in engine on a CPU
    assert (
        measures["lora_training"]["tokens_per_s"] > 0 and measures["lora_training"]["mfu"] is None
    )  # no peak on a CPU
    engines = measures["rl_sampling"]["engines"]
    assert engines["transformers generate"]["ratio_vs_generate"] == 1.0
    assert engines["transformers"]["tokens"] == 4 * 2 * 8
    if with_vllm:
        assert checks["sampler_vs_trainer_vllm"]["passed"] and checks["sampler_vs_trainer_vllm"]["exact"] == 3
        assert engines["vllm"]["tokens"] == 4 * 2 * 8
        assert measures["decode_batch1_vllm"]["tokens_per_s"] > 0
    else:
        assert "not installed" in checks["sampler_vs_trainer_vllm"]["error"]
    assert "bf16 training vs fp32" in done.stdout and "every check passed" in done.stdout


def test_without_a_gpu_it_says_to_use_the_dry_run(tmp_path):
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU: the check would run for real")
    done = subprocess.run(
        [sys.executable, str(GPU_CHECK)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 2 and "--dry-run" in done.stderr
