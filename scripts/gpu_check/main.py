"""scripts/gpu-check: one command that shows what cortex-nb does on a GPU host, with no network.

    scripts/gpu-check [--out artifacts/gpu-check.json] [--shapes qwen2-0.5b-shaped,qwen2-1.5b-shaped]
    scripts/gpu-check --dry-run        # the same stages on a CPU at tiny sizes (CI runs this)

For each model shape (built here from a config, random weights, bf16), in a process of its own:
bf16 LoRA training against an fp32 reference; the same training with AdamW's moments offloaded to host
memory between steps (an adapter host's offload: adapters equal bitwise, the device bytes each holds); each sampling engine (built in, and vLLM where it is
installed) against the trainer after a weight sync; LoRA training tokens/s and MFU; batch-1 decode
against the HBM roofline; RL-shaped sampling throughput for each engine against transformers'
`generate`. Then, once, the product itself: a backend (`--sampler auto`) with a trainer and a sampler,
a sync, greedy compared. NVML readings are taken before and after.

Then the product stages, on the largest shape, each through a backend of its own (`cortex-nb backend
serve`, driven with the cortex_nb client), each recorded under `stages` in the JSON and as rows:
- shared base (`shared_base.py`): 1, 2, 4, 8 rank-16 training jobs as slots of one adapter host
  (`--adapter-host`): the host's memory and aggregate training tokens/s at N over N=1, the bytes the host
  reports per slot and for its base, how many slots would fit this device, and the aggregate sampling
  tokens/s of all slots generating at once (batched across slots) over one;
- quantized base (`quantized_base.py`): the model `--quantize nf4` against itself in full precision: worker
  memory, base bytes and LoRA tokens/s ratios, a check that the loss falls, and an 8B-class base in NF4
  extrapolated as 8e9 x the base bytes per parameter measured (no 8B model is downloaded: no network);
- training across devices (`across_devices.py`): a training sub-job with `n_gpus` = every GPU (FSDP2)
  against one device: step time ratio, per-rank peak memory, and a check that losses agree within 1e-4;
  skipped, saying why, with fewer than 2 GPUs;
- tensor-parallel sampling (`across_devices.py`): a `n_gpus: 2` vLLM sampler against a one-device one:
  greedy tokens equal (a check) and tokens/s; skipped, saying why, without vLLM or 2 GPUs;
- shared vLLM engine (`shared_base.py`): 8 rank-16 vLLM sampling jobs as slots of one adapter host, one vLLM
  engine serving every slot's adapter: aggregate greedy tokens/s of all at once over one; skipped without vLLM.
The dry run runs them on CPU slots at tiny sizes (sub-jobs across devices on two CPU slots over gloo).
A stage that raises is recorded with its reason and the others still run.

Prints one table, writes the whole record as JSON, and exits 1 if a check failed or a product stage
raised (measures never fail it; a skipped stage does not). Meant to finish within ten minutes on one H200.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import across_devices, quantized_base, report, shared_base
from .hardware import device_summary, gpu_count, nvml_readings
from .model_run import attempt
from .service import sampler_matches_trainer
from .shapes import DRY_RUN, QWEN2_0_5B, QWEN2_1_5B, SHAPES, Shape, build_model_dir, parameter_counts

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class StageSizes:
    """Sizes of the product stages: batch rows and length, timed rounds, steps, sampling."""

    rows: int
    length: int
    rounds: int
    quantized_steps: int
    sampling_prompts: int
    sampling_tokens: int


GPU_STAGES = StageSizes(8, 512, 2, 5, 32, 128)
DRY_RUN_STAGES = StageSizes(2, 32, 2, 4, 4, 8)
DRY_RUN_VLLM_SLOTS = 2  # vLLM sampling slots sharing the host's engine in a dry run (8 on a GPU)


def failed(record: dict[str, Any]) -> list[str]:
    out = []
    for model in record["models"]:
        for key, check in model.get("checks", {}).items():
            if key.startswith("sampler_vs_trainer_vllm") and "not installed" in check.get("error", ""):
                continue  # an engine this host does not have: shown, not failed
            if "error" in check or check.get("passed") is False:
                out.append(f"{model['shape']}: {key}")
        if "error" in model:
            out.append(f"{model['shape']}: {model['error'][:200]}")
    for key, stage in record.get("stages", {}).items():
        if "error" in stage:
            out.append(f"{key}: {stage['error'][:200]}")
        for name, check in stage.get("checks", {}).items():
            if check.get("passed") is False:
                out.append(f"{key}: {name}")
    service = record.get("service") or {}
    if "error" in service or (
        service and service.get("exact") != service.get("prompts") and record["mode"] == "dry-run"
    ):
        out.append("service")
    return out


def run_shape(shape: str, model_dir: Path, work: Path, args) -> dict[str, Any]:
    out = work / f"{shape}.json"
    command = [sys.executable, "-m", "gpu_check.model_run", shape, str(model_dir), str(out)]
    if args.dry_run:
        command.append("--dry-run")
    for flag, value in (("--peak-tflops", args.peak_tflops), ("--hbm-tbps", args.hbm_tbps)):
        if value:
            command += [flag, str(value)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        return {"shape": shape, "error": f"exit {done.returncode}: {done.stderr[-3000:]}"}
    return json.loads(out.read_text())


def product_stages(shape: Shape, model_dir: Path, work: Path, dry_run: bool) -> dict[str, Any]:
    """The shared base, the quantized base and sub-jobs across devices, each through a backend of its own on
    the largest shape; a stage that fails is recorded with its reason and the others still run."""
    device = "cpu" if dry_run else "cuda"
    sizes = DRY_RUN_STAGES if dry_run else GPU_STAGES
    gpus = 0 if dry_run else gpu_count()
    if not dry_run:
        import torch

        torch.cuda.empty_cache()  # building the shapes here left cached blocks the backends' workers need
    vocab = shape.config["vocab_size"]
    stages: dict[str, Any] = {}

    def run_stage(key: str, run) -> None:
        started = time.perf_counter()
        attempt(stages, key, run)
        stages[key]["elapsed_s"] = time.perf_counter() - started
        print(f"gpu-check: {key} done in {stages[key]['elapsed_s']:.0f} s", file=sys.stderr, flush=True)

    run_stage(
        "shared_base",
        lambda: shared_base.measure(
            work / "shared-base",
            model_dir,
            # slots of an adapter host take the device's adapter slots (the stage sets how many)
            f"cpu:{max(shared_base.SLOT_COUNTS)}" if dry_run else "0",
            device,
            vocab,
            sizes.rows,
            sizes.length,
            sizes.rounds,
        ),
    )
    run_stage(
        "quantized_base",
        lambda: quantized_base.measure(
            work / "quantized-base",
            model_dir,
            "cpu:1" if dry_run else "0",
            device,
            vocab,
            parameter_counts(shape.config)["total"],
            sizes.rows,
            sizes.length,
            sizes.quantized_steps,
        ),
    )
    ranks = 2 if dry_run else gpus
    if ranks < 2:
        stages["training_across_devices"] = {
            "skipped": f"this host has {gpus} GPU; a training sub-job across devices needs 2 or more"
        }
    else:
        run_stage(
            "training_across_devices",
            lambda: across_devices.training(
                work / "across-devices",
                model_dir,
                "cpu:3" if dry_run else ",".join(str(index) for index in range(gpus)),
                device,
                ranks,
                vocab,
                max(sizes.rows * 2, ranks),
                sizes.length,
            ),
        )
    if importlib.util.find_spec("vllm") is None:
        stages["tensor_parallel_sampling"] = {"skipped": "vLLM is not installed in this Python"}
    elif not dry_run and gpus < 2:
        stages["tensor_parallel_sampling"] = {
            "skipped": f"this host has {gpus} GPU; a tensor-parallel sampler needs 2"
        }
    else:
        run_stage(
            "tensor_parallel_sampling",
            lambda: across_devices.tensor_parallel_sampling(
                work / "tensor-parallel",
                model_dir,
                "cpu:2" if dry_run else "0,1",
                device,
                vocab,
                sizes.sampling_prompts,
                sizes.sampling_tokens,
                sizes.rounds,
            ),
        )
    if importlib.util.find_spec("vllm") is None:
        stages["shared_vllm_engine"] = {"skipped": "vLLM is not installed in this Python"}
    else:
        run_stage(
            "shared_vllm_engine",
            lambda: shared_base.measure_vllm(
                work / "shared-vllm-engine",
                model_dir,
                f"cpu:{DRY_RUN_VLLM_SLOTS}" if dry_run else "0",
                vocab,
                DRY_RUN_VLLM_SLOTS if dry_run else max(shared_base.SLOT_COUNTS),
                sizes.sampling_prompts,
                sizes.sampling_tokens,
            ),
        )
    for stage in stages.values():
        stage["model"] = shape.name
    return stages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="run every stage on the CPU at tiny sizes")
    parser.add_argument("--shapes", default=None, help=f"comma-separated, of {sorted(SHAPES)}")
    parser.add_argument("--out", type=Path, default=Path("artifacts/gpu-check.json"))
    parser.add_argument("--skip-service", action="store_true", help="leave out the backend round trip")
    parser.add_argument(
        "--skip-stages",
        action="store_true",
        help="leave out the shared-base, quantized-base and across-devices stages",
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="dense bf16 peak, if the GPU is not in the table"
    )
    parser.add_argument("--hbm-tbps", type=float, default=None, help="HBM bandwidth in TB/s, likewise")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("CORTEX_DISABLE_TELEMETRY", "1")
    started = time.perf_counter()
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu-check: torch sees no CUDA device here; run it on a GPU host, or use --dry-run on a CPU",
            file=sys.stderr,
        )
        return 2
    device = "cpu" if args.dry_run else "cuda"
    default = [DRY_RUN] if args.dry_run else [QWEN2_0_5B, QWEN2_1_5B]
    shapes = [SHAPES[name] for name in args.shapes.split(",")] if args.shapes else default
    record: dict[str, Any] = {
        "mode": "dry-run" if args.dry_run else "gpu",
        "device": device_summary(device),
        "nvml_before": nvml_readings(),
        "models": [],
    }
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        work = Path(scratch)
        for shape in shapes:
            model_dir = build_model_dir(shape, work / shape.name, device)
            record["models"].append(run_shape(shape.name, model_dir, work, args))
            print(
                f"gpu-check: {shape.name} done at {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        if not args.skip_service:
            shape = shapes[0]
            vocab = shape.config["vocab_size"]
            prompts = [[3 + (7 * i + j) % (vocab - 3) for j in range(16)] for i in range(4)]
            try:
                record["service"] = sampler_matches_trainer(
                    work / "backend",
                    work / shape.name,
                    "cpu:2" if args.dry_run else "0",
                    "auto",
                    vocab,
                    prompts,
                    tokens=8 if args.dry_run else 32,
                    steps=1 if args.dry_run else 2,
                )
            except Exception as exc:
                record["service"] = {"error": f"{type(exc).__name__}: {exc}"}
            record["models"][0].setdefault("checks", {})["service"] = record["service"]
        if not args.skip_stages:
            biggest = max(shapes, key=lambda shape: parameter_counts(shape.config)["total"])
            record["stages"] = product_stages(biggest, work / biggest.name, work, args.dry_run)
    record["nvml_after"] = nvml_readings()
    record["elapsed_s"] = time.perf_counter() - started
    record["failed"] = failed(record)
    report.write_json(record, args.out)
    report.print_table(record)
    print(
        f"\nrecord: {args.out}"
        + (f"; FAILED: {', '.join(record['failed'])}" if record["failed"] else "; every check passed")
    )
    return 1 if record["failed"] else 0
