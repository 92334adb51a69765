"""One table on stdout and the whole record as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _number(value: Any, digits: int = 1, percent: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.{digits}f}%" if percent else f"{value:,.{digits}f}"


def rows_of(record: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(model, what, figure, verdict) rows."""
    rows = []
    for model in record["models"]:
        name = model["shape"]
        for key, check in model.get("checks", {}).items():
            if "error" in check:
                missing = "not installed" in check["error"]
                rows.append((name, key.replace("_", " "), check["error"][:60], "n/a" if missing else "ERROR"))
            elif key == "training_parity":
                figure = (
                    f"max loss rel err {max(s['relative_error'] for s in check['steps']):.2e},"
                    f" logprob mean err {check['probe_logprob_mean_abs_error']:.2e}"
                )
                rows.append((name, "bf16 training vs fp32", figure, "pass" if check["passed"] else "FAIL"))
            elif key == "optimizer_offload":
                figure = (
                    f"adapters equal bitwise: {check['adapters_equal_bitwise']}; device"
                    f" {_mib(check['device_bytes_moments_on_device'])} -> {_mib(check['device_bytes_moments_offloaded'])},"
                    f" host {_mib(check['moments_in_host_memory_bytes'])}"
                )
                rows.append(
                    (name, "optimizer moments offloaded", figure, "pass" if check["passed"] else "FAIL")
                )
            elif key.startswith("sampler_vs_trainer") or key == "service":
                figure = f"{check.get('exact')}/{check.get('prompts')} exact"
                if "near_ties" in check:
                    figure += f", {check['near_ties']} near-ties, dev {check['max_logprob_deviation']:.2e}"
                if "sampler_engine" in check:
                    figure += (
                        f" ({check['sampler_engine']}, sync {check['sync_path']} {check['sync_ms']:.0f} ms)"
                    )
                verdict = (
                    "pass" if check.get("passed", check.get("exact") == check.get("prompts")) else "FAIL"
                )
                rows.append((name, key.replace("_", " "), figure, verdict))
        for key, measure in model.get("measures", {}).items():
            if "error" in measure:
                rows.append((name, key, measure["error"][:60], "ERROR"))
            elif key == "lora_training":
                rows.append(
                    (
                        name,
                        "LoRA training",
                        f"{_number(measure['tokens_per_s'], 0)} tok/s,"
                        f" {_number(measure['achieved_tflops'])} TFLOP/s, MFU {_number(measure['mfu'], percent=True)}",
                        "goal 45%",
                    )
                )
            elif key.startswith("decode_batch1"):
                rows.append(
                    (
                        name,
                        f"batch-1 decode ({measure['engine']})",
                        f"{_number(measure['tokens_per_s'], 0)} tok/s,"
                        f" {_number(measure['fraction_of_roofline'], percent=True)} of HBM roofline",
                        "goal 60%",
                    )
                )
            elif key == "rl_sampling":
                for engine, row in measure["engines"].items():
                    rows.append(
                        (
                            name,
                            f"RL-shaped {measure['shape']} ({engine})",
                            f"{_number(row['tokens_per_s'], 0)} tok/s, {_number(row['ratio_vs_generate'], 2)}x generate",
                            "goal 3x (vllm)" if engine == "vllm" else "",
                        )
                    )
    for key, stage in record.get("stages", {}).items():
        rows += stage_rows(key, stage)
    return rows


def _mib(value: float) -> str:
    return f"{value / 2**20:,.1f} MiB"


def _verdict(check: dict[str, Any]) -> str:
    return "pass" if check["passed"] else "FAIL"


def stage_rows(key: str, stage: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The rows of one product stage (shared base, quantized base, across devices)."""
    name, what = stage.get("model", "-"), key.replace("_", " ")
    if "error" in stage:
        return [(name, what, stage["error"][:60], "ERROR")]
    if "skipped" in stage:
        return [(name, what, f"skipped: {stage['skipped']}", "n/a")]
    rows = []
    if key == "shared_vllm_engine":
        most = str(stage["slots"])
        return [
            (
                name,
                f"shared vLLM engine, {most} sampling slots at once",
                f"aggregate tok/s {stage['tokens_per_s_ratio_vs_1']:.2f}x 1 slot"
                f" ({_number(stage['tokens_per_s'][most], 0)} tok/s; host holds {_mib(stage['host_bytes_once'])}"
                " once)",
                "",
            )
        ]
    if key == "shared_base":
        for count, figures in stage["slots"].items():
            if count == "1":
                continue
            rows.append(
                (
                    name,
                    f"shared base, {count} slots",
                    f"memory {figures['memory_ratio_vs_1']:.2f}x 1 slot ({figures['memory_kind']}),"
                    f" aggregate tok/s {figures['tokens_per_s_ratio_vs_1']:.2f}x 1 slot",
                    "",
                )
            )
        one = stage["slots"]["1"]
        rows.append(
            (
                name,
                "shared base, slots per device",
                f"~{stage['slots_per_device_estimate']:,} (base {_mib(one['base_bytes'])}, slot reports"
                f" {_mib(stage['reported_slot_bytes'])}, grows {_mib(stage['measured_growth_per_slot_bytes'])})",
                "estimate",
            )
        )
        sampling = stage["sampling"]
        most = max(sampling["tokens_per_s"], key=int)
        rows.append(
            (
                name,
                f"shared base, {most} slots sampling at once",
                f"aggregate tok/s {sampling['tokens_per_s_ratio_vs_1']:.2f}x 1 slot"
                f" ({_number(sampling['tokens_per_s'][most], 0)} tok/s; {sampling['passes_of_several_slots']}"
                " passes of several slots)",
                "",
            )
        )
    elif key == "quantized_base":
        rows.append(
            (
                name,
                "QLoRA nf4 base vs full",
                f"worker memory {stage['worker_memory_ratio']:.2f}x ({stage['nf4']['memory_kind']}),"
                f" base bytes {stage['base_bytes_ratio']:.2f}x, LoRA tok/s {stage['tokens_per_s_ratio']:.2f}x",
                "",
            )
        )
        check = stage["checks"]["loss_falls"]
        rows.append(
            (
                name,
                "QLoRA nf4 loss falls",
                f"{check['first']:.4f} -> {check['last']:.4f} over {stage['steps']} steps",
                _verdict(check),
            )
        )
        rows.append(
            (
                name,
                "8B-class base in nf4",
                f"~{stage['base_8b_nf4_bytes_extrapolated'] / 2**30:.1f} GiB"
                f" ({stage['nf4_base_bytes_per_parameter']:.3f} B/param measured x 8e9)",
                "extrapolated",
            )
        )
    elif key == "training_across_devices":
        check = stage["checks"]["losses_equal"]
        rows.append(
            (
                name,
                f"FSDP2 training, {stage['n_gpus']} devices vs 1",
                f"step time {stage['step_time_ratio']:.2f}x, per-rank peak"
                f" {stage['rank_memory_ratio']:.2f}x ({stage['peak_memory_kind']})",
                "",
            )
        )
        rows.append(
            (
                name,
                "FSDP2 losses equal 1 device",
                f"max diff {check['max_abs_difference']:.1e} (tol {check['tolerance']:.0e})",
                _verdict(check),
            )
        )
    elif key == "tensor_parallel_sampling":
        check = stage["checks"]["greedy_equal"]
        rows.append(
            (
                name,
                f"vLLM TP={stage['tensor_parallel_size']} sampling vs 1 device",
                f"{check['exact']}/{check['prompts']} greedy equal,"
                f" tok/s {stage['tokens_per_s_ratio']:.2f}x ({stage['shape']})",
                _verdict(check),
            )
        )
    return rows


def print_table(record: dict[str, Any]) -> None:
    rows = rows_of(record)
    widths = [max(len(row[i]) for row in rows + [("model", "what", "figure", "verdict")]) for i in range(4)]
    header = ("model", "what", "figure", "verdict")
    print(f"\ngpu-check on {record['device']['name']} ({record['mode']}, {record['elapsed_s']:.0f} s)")
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def write_json(record: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=float))
