"""pandas views of what the backend returns: jobs, samples, capacity, models, requests, runs, device metrics,
checkpoints."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from .training import GenerateResult


def _time(value: float | None):
    return datetime.fromtimestamp(value, tz=timezone.utc) if value else None


def jobs_frame(jobs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    rows = [
        {
            "job_id": job["job_id"],
            "name": job.get("name"),
            "labels": ", ".join(f"{key}={value}" for key, value in sorted((job.get("labels") or {}).items())),
            "status": job["status"],
            "failure_code": job.get("failure_code"),
            "base_model": job["sub_jobs"][0]["base_model"] if job["sub_jobs"] else None,
            "sub_jobs": ", ".join(sub["sub_job_id"] for sub in job["sub_jobs"]),
            "devices": ", ".join(sorted({sub["device"] for sub in job["sub_jobs"] if sub.get("device")})),
            "created_at": _time(job.get("created_at")),
            "finished_at": _time(job.get("finished_at")),
        }
        for job in jobs
    ]
    columns = ["job_id", "name", "labels", "status", "failure_code", "base_model", "sub_jobs", "devices", "created_at",
               "finished_at"]
    return pd.DataFrame(rows, columns=columns)


def samples_frame(result: GenerateResult) -> pd.DataFrame:
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
    return pd.DataFrame(rows, columns=["prompt", "sample_index", "sample", "logprob", "num_tokens", "finish_reason"])


def capacity_frame(capacity: dict[str, Any]) -> pd.DataFrame:
    import pandas as pd

    columns = ["id", "kind", "name", "memory_bytes", "slots", "slots_in_use", "slots_available"]
    return pd.DataFrame([{key: device.get(key) for key in columns} for device in capacity["devices"]], columns=columns)


def models_frame(models: Sequence[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    columns = ["name", "kind", "architecture", "vocab_size", "max_positions", "hidden_size", "num_layers"]
    return pd.DataFrame([{key: model.get(key) for key in columns} for model in models], columns=columns)


RUN_COLUMNS = ["run_id", "name", "status", "failure_code", "exit_code", "isolation_tier", "devices", "created_at",
               "finished_at", "submission_id"]


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
    "gpu_utilization_percent", "gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_temperature_c", "gpu_power_watts",
    "cpu_percent", "ram_used_bytes", "ram_total_bytes",
)


def metrics_frame(samples: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Device samples, one row per device per tick. A GPU column appears only when some sample has
    it: on a host without NVML there are no GPU columns at all, rather than columns of zeros."""
    import pandas as pd

    present = [name for name in METRIC_COLUMNS if any(name in sample for sample in samples)]
    rows = [
        {"at": _time(sample["at"]), "device": sample["device"], **{name: sample.get(name) for name in present},
         "sub_job_ids": ", ".join(sample.get("sub_job_ids", []))}
        for sample in samples
    ]
    return pd.DataFrame(rows, columns=["at", "device", *present, "sub_job_ids"])


def checkpoints_frame(checkpoints: Sequence[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    columns = ["checkpoint_id", "type", "step", "created_at", "size_bytes", "sub_job_id", "base_model", "state_hash"]
    rows = [
        {**{key: checkpoint.get(key) for key in columns}, "created_at": _time(checkpoint.get("created_at"))}
        for checkpoint in checkpoints
    ]
    return pd.DataFrame(rows, columns=columns)
