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
    offload = checks["optimizer_offload"]  # on a CPU nothing moves: the same steps, bitwise
    assert offload["adapters_equal_bitwise"] and offload["moments_in_host_memory_bytes"] > 0
    assert "optimizer moments offloaded" in done.stdout
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
    _assert_product_stages(record["stages"], with_vllm, done.stdout)


def _assert_product_stages(stages: dict, with_vllm: bool, table: str) -> None:
    """The shared base, the quantized base and sub-jobs across devices ran through the backend."""
    shared = stages["shared_base"]
    assert set(shared["slots"]) == {"1", "2", "4", "8"}
    assert len({figures["host_pid"] for figures in shared["slots"].values()}) == 1  # one host for every slot
    for count, figures in shared["slots"].items():
        assert figures["memory_kind"] == "cpu_pss" and figures["memory_bytes"] > 0
        assert figures["base_bytes"] > 0 and figures["tokens_per_s"] > 0
        assert figures["slots_bytes"] == int(count) * shared["reported_slot_bytes"] > 0
    # Slots share the base and the process: four jobs cost well under twice one.
    assert shared["slots"]["4"]["memory_bytes"] < 2 * shared["slots"]["1"]["memory_bytes"]
    assert (
        shared["slots"]["8"]["memory_ratio_vs_1"] > 0 and shared["slots"]["8"]["tokens_per_s_ratio_vs_1"] > 0
    )
    assert shared["slots_per_device_estimate"] >= 1
    # All slots sampling at once: the host batched waiting slots' generates into shared passes.
    sampling = shared["sampling"]
    assert sampling["tokens_per_s"]["1"] > 0 and sampling["tokens_per_s_ratio_vs_1"] > 0
    assert sampling["passes_of_several_slots"] >= 1
    assert "8 slots sampling at once" in table

    quantized = stages["quantized_base"]
    assert quantized["nf4"]["quantization"] == "nf4" and quantized["full_precision"]["quantization"] is None
    assert quantized["worker_memory_ratio"] > 0 and quantized["tokens_per_s_ratio"] > 0
    assert 0 < quantized["base_bytes_ratio"] < 1  # the base is held in fewer bytes
    losses = quantized["nf4"]["losses"]
    assert len(losses) == 4 and losses[-1] < losses[0] and quantized["checks"]["loss_falls"]["passed"]
    assert quantized["base_8b_nf4_bytes_extrapolated"] == pytest.approx(
        8e9 * quantized["nf4_base_bytes_per_parameter"]
    )

    across = stages["training_across_devices"]
    assert across["n_gpus"] == 2 and across["sharding"]["world_size"] == 2
    one, many = across["losses_one_device"], across["losses_across_devices"]
    assert len(one) == len(many) == 3
    assert all(abs(a - b) <= 1e-4 for a, b in zip(one, many, strict=True))
    assert across["checks"]["losses_equal"]["passed"]
    assert len(across["rank_peak_memory_bytes"]) == 2 and min(across["rank_peak_memory_bytes"]) > 0
    assert across["step_time_ratio"] > 0 and across["rank_memory_ratio"] > 0

    sampling = stages["tensor_parallel_sampling"]
    if with_vllm:
        assert sampling["checks"]["greedy_equal"]["passed"] and sampling["tensor_parallel_size"] == 2
        assert sampling["tokens_per_s_ratio"] > 0
    else:
        assert "vLLM" in sampling["skipped"]
    shared_engine = stages["shared_vllm_engine"]
    if with_vllm:  # both slots on the host's one engine (measure_vllm checks it and raises otherwise)
        assert shared_engine["slots"] == 2 and shared_engine["tokens_per_s_ratio_vs_1"] > 0
        assert shared_engine["host_bytes_once"] >= 2**30  # the engine's KV cache among what is held once
        assert "shared vLLM engine, 2 sampling slots at once" in table
    else:
        assert "vLLM" in shared_engine["skipped"]
    for row in ("shared base, 8 slots", "slots per device", "QLoRA nf4 loss falls", "FSDP2 losses equal"):
        assert row in table


def test_a_failed_stage_is_recorded_and_fails_the_run():
    sys.path.insert(0, str(REPO / "scripts"))
    from gpu_check.main import failed
    from gpu_check.model_run import attempt
    from gpu_check.report import stage_rows

    stages: dict = {}
    attempt(stages, "shared_base", lambda: 1 / 0)
    stages["training_across_devices"] = {"checks": {"losses_equal": {"passed": False}}}
    stages["tensor_parallel_sampling"] = {"skipped": "vLLM is not installed in this Python"}
    record = {"models": [], "stages": stages, "mode": "gpu"}
    assert failed(record) == [
        "shared_base: ZeroDivisionError: division by zero",
        "training_across_devices: losses_equal",
    ]
    assert stage_rows("shared_base", stages["shared_base"])[0][3] == "ERROR"
    assert stage_rows("tensor_parallel_sampling", stages["tensor_parallel_sampling"])[0][3] == "n/a"


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
