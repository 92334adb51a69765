"""pandas views of what the backend returns: jobs, samples, capacity, models, requests, runs, device metrics,
checkpoints."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pandas as pd


# What the views read of the objects that show themselves through them (`training.GenerateResult`,
# `comparison.Comparison`): named here so that views depend on no object above them.
class SampleSet(Protocol):
    prompts: list[Any]
    samples: list[dict[str, Any]]


class ScoredSample(Protocol):
    prompt: str
    job_id: str
    text: str
    tokens: list[str]
    logprobs: dict[str, list[float]]

    def difference(self, other_job_id: str) -> list[float]: ...


class ComparedRuns(Protocol):
    jobs: list[dict[str, Any]]
    ab: list[Any]  # ScoredSample each

    def label(self, job_id: str) -> str: ...


def _time(value: float | None):
    return datetime.fromtimestamp(value, tz=timezone.utc) if value else None


JOB_COLUMNS = [
    "job_id",
    "name",
    "labels",
    "status",
    "detail",
    "base_model",
    "step",
    "total_steps",
    "loss_per_token",
    "eval_loss_per_token",
    "duration",
    "lr",
    "lora_r",
    "batch_size",
    "steps",
    "devices",
    "failure_code",
    "created_at",
    "finished_at",
]


def jobs_frame(jobs: Sequence[dict[str, Any]], now: float | None = None) -> pd.DataFrame:
    """Jobs, one row each: the display word and detail (`cortex_nb.protocol.states.display_state`), where their
    training got (the backend's progress record), how long it ran, and the hyperparameters that tell
    runs apart."""
    import pandas as pd

    from .protocol.states import clock, display_state

    rows = []
    for job in jobs:
        word, detail = display_state(job, now)
        progress = job.get("progress") or {}
        trainer = next((sub for sub in job["sub_jobs"] if sub["type"] == "training"), None)
        loop = job.get("training_loop") or {}
        duration = job_duration(job)
        rows.append(
            {
                "job_id": job["job_id"],
                "name": job.get("name"),
                "labels": ", ".join(
                    f"{key}={value}" for key, value in sorted((job.get("labels") or {}).items())
                ),
                "status": word,
                "detail": detail,
                "base_model": job["sub_jobs"][0]["base_model"] if job["sub_jobs"] else None,
                "step": progress.get("step"),
                "total_steps": progress.get("total_steps"),
                "loss_per_token": progress.get("loss_per_token"),
                "eval_loss_per_token": progress.get("eval_loss_per_token"),
                "duration": clock(duration) if duration is not None else None,
                "lr": ((trainer or {}).get("optimizer") or {}).get("lr"),
                "lora_r": ((trainer or {}).get("lora") or {}).get("r"),
                "batch_size": loop.get("batch_size"),
                "steps": loop.get("steps"),
                "devices": ", ".join(sorted({sub["device"] for sub in job["sub_jobs"] if sub.get("device")})),
                "failure_code": job.get("failure_code"),
                "created_at": _time(job.get("created_at")),
                "finished_at": _time(job.get("finished_at")),
            }
        )
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def job_duration(job: dict[str, Any]) -> float | None:
    """Seconds the job trained (its progress record's), else ran: from start to end (or now)."""
    import time

    elapsed = (job.get("progress") or {}).get("elapsed_s")
    if elapsed is not None:
        return float(elapsed)
    if job.get("started_at"):
        return (job.get("finished_at") or time.time()) - job["started_at"]
    return None


def samples_frame(result: SampleSet) -> pd.DataFrame:
    import pandas as pd

    rows = []
    for sample in result.samples:
        prompt = result.prompts[sample["prompt_index"]]
        rows.append(
            {
                "prompt": prompt if isinstance(prompt, str) else str(prompt),
                "sample_index": sample["sample_index"],
                "sample": sample["text"] if sample["text"] is not None else str(sample["tokens"]),
                "logprob": sample["logprob"],
                "num_tokens": len(sample["tokens"]),
                "finish_reason": sample["finish_reason"],
            }
        )
    return pd.DataFrame(
        rows, columns=["prompt", "sample_index", "sample", "logprob", "num_tokens", "finish_reason"]
    )


def capacity_frame(capacity: dict[str, Any]) -> pd.DataFrame:
    import pandas as pd

    columns = [
        "host",
        "id",
        "kind",
        "name",
        "memory_bytes",
        "slots",
        "slots_in_use",
        "slots_available",
        "sampler",
    ]
    return pd.DataFrame(
        [{key: device.get(key) for key in columns} for device in capacity["devices"]], columns=columns
    )


def hosts_text(capacity: dict[str, Any]) -> str:
    """`cortex-nb host list`: one line per host (devices, models, free slots), then the totals."""
    hosts = capacity.get("hosts") or []
    if not hosts:
        return "no hosts serve this backend yet (hosts join with `cortex-nb host join HEAD_ADDRESS`)"
    kinds = {device["id"]: device.get("name") or device["kind"] for device in capacity["devices"]}
    rows = [("HOST", "DEVICES", "MODELS", "FREE SLOTS")]
    for host in hosts:
        models = host.get("models")
        rows.append(
            (
                host["host"],
                ", ".join(f"{device_id} ({kinds.get(device_id, '?')})" for device_id in host["devices"]),
                ", ".join(models) if models is not None else "all registered",
                f"{host['slots_available']}/{host['slots_total']}",
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + "  " + row[3]
        for row in rows
    ]
    lines.append(
        f"{len(hosts)} host(s), {capacity['slots_available']}/{capacity['slots_total']} slots free,"
        f" {capacity.get('pending', 0)} job(s) queued"
    )
    return "\n".join(lines)


def models_frame(models: Sequence[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    columns = ["name", "kind", "architecture", "vocab_size", "max_positions", "hidden_size", "num_layers"]
    return pd.DataFrame([{key: model.get(key) for key in columns} for model in models], columns=columns)


RUN_COLUMNS = [
    "run_id",
    "name",
    "status",
    "failure_code",
    "exit_code",
    "isolation_tier",
    "devices",
    "created_at",
    "finished_at",
    "submission_id",
]


def runs_frame(runs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Source runs, one row each (what `client.history()` shows)."""
    import pandas as pd

    rows = [
        {
            "run_id": run["run_id"],
            "name": run.get("name"),
            "status": run["status"],
            "failure_code": run.get("failure_code"),
            "exit_code": run.get("exit_code"),
            "isolation_tier": run.get("isolation_tier"),
            "devices": ", ".join(run.get("devices") or []),
            "created_at": _time(run.get("created_at")),
            "finished_at": _time(run.get("finished_at")),
            "submission_id": run.get("submission_id"),
        }
        for run in runs
    ]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


# observability ---------------------------------------------------------------------------------------
METRIC_COLUMNS = (
    "gpu_utilization_percent",
    "gpu_memory_used_bytes",
    "gpu_memory_total_bytes",
    "gpu_temperature_c",
    "gpu_power_watts",
    "cpu_percent",
    "ram_used_bytes",
    "ram_total_bytes",
    "job_cpu_percent",
    "job_ram_bytes",
)


def metrics_frame(samples: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Device samples, one row per device per tick. A GPU column appears only when some sample has
    it: on a host without NVML there are no GPU columns at all, rather than columns of zeros."""
    import pandas as pd

    present = [name for name in METRIC_COLUMNS if any(name in sample for sample in samples)]
    rows = [
        {
            "at": _time(sample["at"]),
            "device": sample["device"],
            **{name: sample.get(name) for name in present},
            "sub_job_ids": ", ".join(sample.get("sub_job_ids", [])),
        }
        for sample in samples
    ]
    return pd.DataFrame(rows, columns=["at", "device", *present, "sub_job_ids"])


def checkpoints_frame(checkpoints: Sequence[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    columns = [
        "checkpoint_id",
        "type",
        "step",
        "created_at",
        "size_bytes",
        "sub_job_id",
        "base_model",
        "state_hash",
    ]
    rows = [
        {**{key: checkpoint.get(key) for key in columns}, "created_at": _time(checkpoint.get("created_at"))}
        for checkpoint in checkpoints
    ]
    return pd.DataFrame(rows, columns=columns)


def history_frame(progress: dict[str, Any] | None) -> pd.DataFrame:
    """A progress record's loss curves as one table: step, loss_per_token, eval_loss_per_token."""
    import pandas as pd

    columns = ["step", "loss_per_token", "eval_loss_per_token"]
    progress = progress or {}
    train = pd.DataFrame(progress.get("history") or [], columns=["step", "loss_per_token"])
    held_out = pd.DataFrame(progress.get("eval_history") or [], columns=["step", "eval_loss_per_token"])
    merged = train.merge(held_out, on="step", how="outer").sort_values("step", kind="stable")
    return merged.reset_index(drop=True)[columns]


# comparing runs (cortex_nb.compare) -------------------------------------------------------------------
def curves_frame(jobs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Every run's loss curves in one long table: job_id, name, step, loss_per_token, eval_loss_per_token."""
    import pandas as pd

    frames = []
    for job in jobs:
        frame = history_frame(job.get("progress"))
        frame.insert(0, "name", job.get("name") or job["job_id"])
        frame.insert(0, "job_id", job["job_id"])
        frames.append(frame)
    columns = ["job_id", "name", "step", "loss_per_token", "eval_loss_per_token"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


RUN_TABLE_COLUMNS = [
    "job_id",
    "name",
    "status",
    "base_model",
    "lr",
    "lora_r",
    "lora_alpha",
    "batch_size",
    "max_seq_len",
    "steps",
    "seed",
    "step",
    "loss_per_token",
    "eval_loss_per_token",
    "tokens",
    "duration_s",
    "last_checkpoint",
]


def runs_table(jobs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per run: the hyperparameters that tell runs apart and the final metrics."""
    import pandas as pd

    from .protocol.states import display_state

    rows = []
    for job in jobs:
        trainer = next((sub for sub in job["sub_jobs"] if sub["type"] == "training"), job["sub_jobs"][0])
        loop = job.get("training_loop") or {}
        progress = job.get("progress") or {}
        lora = trainer.get("lora") or {}
        rows.append(
            {
                "job_id": job["job_id"],
                "name": job.get("name"),
                "status": display_state(job)[0],
                "base_model": trainer["base_model"],
                "lr": (trainer.get("optimizer") or {}).get("lr"),
                "lora_r": lora.get("r"),
                "lora_alpha": lora.get("alpha"),
                "batch_size": loop.get("batch_size"),
                "max_seq_len": loop.get("max_seq_len"),
                "steps": loop.get("steps"),
                "seed": loop.get("seed", trainer.get("seed")),
                "step": progress.get("step"),
                "loss_per_token": progress.get("loss_per_token"),
                "eval_loss_per_token": progress.get("eval_loss_per_token"),
                "tokens": progress.get("tokens"),
                "duration_s": job_duration(job),
                "last_checkpoint": progress.get("last_checkpoint"),
            }
        )
    return pd.DataFrame(rows, columns=RUN_TABLE_COLUMNS)


def ab_frame(comparison: ComparedRuns) -> pd.DataFrame:
    """One row per prompt and run: the greedy sample, its summed logprob under its own run, and (per other
    run) the mean per-token logprob difference of that answer under the other run."""
    import pandas as pd

    job_ids = [job["job_id"] for job in comparison.jobs]
    rows = []
    for sample in comparison.ab:
        row = {
            "prompt": sample.prompt,
            "job_id": sample.job_id,
            "run": comparison.label(sample.job_id),
            "sample": sample.text,
            "num_tokens": len(sample.tokens),
            "logprob": sum(sample.logprobs[sample.job_id]),
        }
        for other in job_ids:
            if other != sample.job_id:
                differences = sample.difference(other)
                row[f"mean_logprob_diff_under_{other}"] = (
                    sum(differences) / len(differences) if differences else None
                )
        rows.append(row)
    return pd.DataFrame(rows)
