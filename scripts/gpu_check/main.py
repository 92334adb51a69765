"""scripts/gpu-check: one command that shows what cortex-nb does on a GPU host, with no network.

    scripts/gpu-check [--out artifacts/gpu-check.json] [--shapes qwen2-0.5b-shaped,qwen2-1.5b-shaped]
    scripts/gpu-check --dry-run        # the same stages on a CPU at tiny sizes (CI runs this)

For each model shape (built here from a config, random weights, bf16), in a process of its own:
bf16 LoRA training against an fp32 reference; each sampling engine (built in, and vLLM where it is
installed) against the trainer after a weight sync; LoRA training tokens/s and MFU; batch-1 decode
against the HBM roofline; RL-shaped sampling throughput for each engine against transformers'
`generate`. Then, once, the product itself: a backend (`--sampler auto`) with a trainer and a sampler,
a sync, greedy compared. NVML readings are taken before and after. Prints one table, writes the whole
record as JSON, and exits 1 if a check failed (measures never fail it). Meant to finish within ten
minutes on one H200.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import report
from .hardware import device_summary, nvml_readings
from .service import sampler_matches_trainer
from .shapes import DRY_RUN, QWEN2_0_5B, QWEN2_1_5B, SHAPES, build_model_dir

HERE = Path(__file__).resolve().parent


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="run every stage on the CPU at tiny sizes")
    parser.add_argument("--shapes", default=None, help=f"comma-separated, of {sorted(SHAPES)}")
    parser.add_argument("--out", type=Path, default=Path("artifacts/gpu-check.json"))
    parser.add_argument("--skip-service", action="store_true", help="leave out the backend round trip")
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
