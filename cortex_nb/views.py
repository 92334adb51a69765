"""pandas views of what the backend returns: jobs, samples, capacity, models, requests, runs, device metrics,
checkpoints."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from .protocol.states import user_labels

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
                    f"{key}={value}" for key, value in sorted(user_labels(job.get("labels")).items())
                ),
                "status": word,
                "detail": detail,
                "base_model": job["sub_jobs"][0]["base_model"] if job["sub_jobs"] else None,
                "step": progress.get("step"),
                "total_steps": progress.get("total_steps"),
                "loss_per_token": progress.get("loss_per_token"),
                "eval_loss_per_token": progress.get("eval_loss_per_token"),
                "duration": clock(duration) if duration is not None else None,
                "lr": trainer_setting(trainer, "optimizer", "lr"),
                "lora_r": trainer_setting(trainer, "lora", "r"),
                "batch_size": loop.get("batch_size"),
                "steps": loop.get("steps"),
                "devices": ", ".join(sorted({sub["device"] for sub in job["sub_jobs"] if sub.get("device")})),
                "failure_code": job.get("failure_code"),
                "created_at": _time(job.get("created_at")),
                "finished_at": _time(job.get("finished_at")),
            }
        )
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def trainer_setting(trainer: dict[str, Any] | None, group: str, key: str) -> Any:
    """A training sub-job's LoRA or optimizer setting as the engine used it: the value given, else the
    spec's default (a job stores only what its creator wrote, so a table would show NaN for defaults)."""
    if trainer is None or trainer.get("type") != "training":
        return None
    given = (trainer.get(group) or {}).get(key)
    if given is not None:
        return given
    from .protocol.schemas.jobs import LoraSpec, OptimizerSpec

    spec = {"lora": LoraSpec, "optimizer": OptimizerSpec}[group]
    return spec.model_fields[key].default


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
    if any(device.get("adapter_slots") for device in capacity["devices"]):
        # A device with an adapter host serves these beside its process slots (one process, one base).
        columns += ["adapter_slots", "adapter_slots_in_use", "adapter_slots_available"]
    return pd.DataFrame(
        [{key: device.get(key) for key in columns} for device in capacity["devices"]], columns=columns
    )


def adapter_host_lines(capacity: dict[str, Any]) -> list[str]:
    """One line per adapter host: how many slots (training, sampling, log-probability) share its one copy
    of a base, and what they add (the sidebar's Devices section says the same, labextension/src/model.ts
    `adapterHostLines`)."""
    from .protocol.states import format_bytes

    hosts = (capacity.get("executor") or {}).get("adapter_hosts") or []
    vllm_devices = {
        device.get("id") for device in capacity.get("devices") or [] if device.get("sampler") == "vllm"
    }
    return [
        f"adapter host {host['device']} · {host['base_model']}: {host['slots']} slot(s) on one base"
        f" ({format_bytes(host['base_bytes'])} held once; slots add {format_bytes(host['slots_bytes'])})"
        + batched_words(host.get("batched_operations") or [])
        + (VLLM_HOST_WORDS if host["device"] in vllm_devices else "")
        for host in hosts
    ]


# The end of the line of a host on a device sampling with vLLM (engine/hosted_vllm.py).
VLLM_HOST_WORDS = "; its vLLM sampling slots share one vLLM engine"


def batched_words(operations: list[str]) -> str:
    """What a host runs for several slots in one pass (--batch-across-slots), as the end of its line."""
    return f"; {' and '.join(sorted(operations, reverse=True))} batched across slots" if operations else ""


HOSTING_WORDS = {
    "auto": "adapter hosts on GPUs (slots share a process and its base), a process per sub-job on CPUs",
    "adapter_host": "adapter hosts on every device (slots share a process and its base)",
    "isolation_per_job": "a process per sub-job on every device",
    # `auto` on a backend whose devices are all of one kind: only that half applies.
    "auto:cpu": "a process per sub-job",
    "auto:cuda": "adapter hosts (slots share a process and its base)",
}


def hosting_line(capacity: dict[str, Any]) -> str | None:
    """How the executor runs sub-jobs ("hosting: ..."; on Ray each process is an actor), and whether CPU
    workers are forks of one process; None for a backend that does not say (one older than the choice).
    The sidebar's Devices section says the same (labextension/src/model.ts `hostingLine`)."""
    executor = capacity.get("executor") or {}
    hosting = executor.get("hosting") or ""
    kinds = {device.get("kind") for device in capacity.get("devices") or []}
    if hosting == "auto" and len(kinds) == 1:
        hosting = f"auto:{kinds.pop()}"
    words = HOSTING_WORDS.get(hosting)
    if words is None:
        return None
    forked = "; CPU workers forked from one process" if executor.get("fork_server") else ""
    return f"hosting: {words}{forked}"


def quantized_models_line(capacity: dict[str, Any]) -> str | None:
    """The bases held quantized ("quantized bases: llama-8b nf4"), or None; the sidebar's Devices section
    says the same (labextension/src/model.ts `quantizedModelsLine`)."""
    quantized = capacity.get("quantized_models") or {}
    if not quantized:
        return None
    return "quantized bases: " + ", ".join(f"{name} {kind}" for name, kind in sorted(quantized.items()))


def hosts_text(capacity: dict[str, Any]) -> str:
    """`cortex-nb host list`: one line per host (devices, models, free slots), then the totals."""
    hosts = capacity.get("hosts") or []
    if not hosts:
        return (
            "no hosts serve this backend yet (hosts join with `cortex-nb host join HEAD_ADDRESS --token-file"
            " FILE`, FILE a copy of the head's DATA_DIR/ray-auth-token)"
        )
    kinds = {device["id"]: device.get("name") or device["kind"] for device in capacity["devices"]}
    rows = [("HOST", "DEVICES", "MODELS", "FREE SLOTS")]
    for host in hosts:
        models = host.get("models")
        rows.append(
            (
                host["host"],
                ", ".join(f"{device_id} ({kinds.get(device_id, '?')})" for device_id in host["devices"]),
                ", ".join(models) if models is not None else "all registered",
                f"{host['slots_available']}/{host['slots_total']}"
                + (
                    f" (+{host['adapter_slots_available']}/{host['adapter_slots_total']} adapter)"
                    if host.get("adapter_slots_total")
                    else ""
                ),
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
    if (capacity.get("executor") or {}).get("ray_insecure"):
        lines.append(
            "warning: the Ray cluster takes clients without a token (--ray-insecure): anyone who reaches its"
            " ports can run code on its hosts"
        )
    return "\n".join(lines)


def models_frame(models: Sequence[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    columns = [
        "name",
        "kind",
        "architecture",
        "vocab_size",
        "max_positions",
        "hidden_size",
        "num_layers",
        "quantization",
    ]
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
        "expires_at",
        "public",
    ]
    rows = [
        {
            **{key: checkpoint.get(key) for key in columns},
            "created_at": _time(checkpoint.get("created_at")),
            "expires_at": _time(checkpoint.get("expires_at")),
            "public": bool(checkpoint.get("public")),
        }
        for checkpoint in checkpoints
    ]
    return pd.DataFrame(rows, columns=columns)


def lineage_frame(lineage: dict[str, Any]) -> pd.DataFrame:
    """A job's lineage (`GET /v1/jobs/{id}/lineage`) as one row per checkpoint, oldest first: its step,
    bytes (as `format_bytes` writes them, and raw), keep mark, and where its weights went: exports, loads
    into other sub-jobs, samplings of it as a saved adapter. `attrs` carry the job, its step, its weight
    syncs and where its weights came from (`origins`)."""
    import pandas as pd

    from .protocol.states import format_bytes

    columns = [
        "checkpoint_id",
        "step",
        "type",
        "size",
        "size_bytes",
        "kept",
        "created_at",
        "exports",
        "loaded_into",
        "sampled_by",
    ]
    rows = []
    for checkpoint in lineage["checkpoints"]:
        uses = checkpoint["uses"]
        rows.append(
            {
                "checkpoint_id": checkpoint["checkpoint_id"],
                "step": checkpoint["step"],
                "type": checkpoint["type"],
                "size": format_bytes(checkpoint["size_bytes"]),
                "size_bytes": checkpoint["size_bytes"],
                "kept": checkpoint["kept"],
                "created_at": _time(checkpoint["created_at"]),
                "exports": len(checkpoint["exports"]),
                "loaded_into": ", ".join(sorted({use["job_id"] for use in uses if use["op"] == "load"})),
                "sampled_by": ", ".join(sorted({use["job_id"] for use in uses if use["op"] != "load"})),
            }
        )
    frame = pd.DataFrame(rows, columns=columns)
    frame.attrs.update(
        job_id=lineage["job_id"],
        name=lineage["name"],
        step=lineage["step"],
        size=format_bytes(lineage["size_bytes"]),
        weight_syncs=len(lineage["weight_syncs"]),
        # Where its weights came from, nearest first: "job/checkpoint (via)" joined by " ← ".
        origins=" ← ".join(
            f"{origin['source_job_id']}/{origin['checkpoint_id']} ({origin['via']})"
            for origin in lineage.get("origins", [])
        ),
    )
    return frame


def storage_frame(storage: dict[str, Any]) -> pd.DataFrame:
    """`GET /v1/storage` as one row per job holding checkpoints, largest first per owner; `attrs["meters"]`
    has one line per owner: used of quota."""
    import pandas as pd

    from .protocol.states import format_bytes

    columns = ["owner", "job_id", "name", "status", "checkpoints", "kept", "size", "size_bytes"]
    rows = [
        {
            "owner": owner["owner"],
            "job_id": job["job_id"],
            "name": job["name"],
            "status": job["status"],
            "checkpoints": job["checkpoint_count"],
            "kept": job["kept_count"],
            "size": format_bytes(job["size_bytes"]),
            "size_bytes": job["size_bytes"],
        }
        for owner in storage["owners"]
        for job in owner["jobs"]
    ]
    frame = pd.DataFrame(rows, columns=columns)
    frame.attrs["meters"] = [storage_meter(owner) for owner in storage["owners"]]
    return frame


def storage_meter(owner: dict[str, Any]) -> str:
    """ "alice: 1.5 GiB of 50 GiB checkpoint quota (3.0%), 12 checkpoints" (or "no quota")."""
    from .protocol.states import format_bytes

    used, quota = owner["used_bytes"], owner["quota_bytes"]
    share = (
        f"of {format_bytes(quota)} checkpoint quota ({100 * used / quota:.1f}%)" if quota else "(no quota)"
    )
    count = owner["checkpoint_count"]
    return f"{owner['owner']}: {format_bytes(used)} {share}, {count} checkpoint{'' if count == 1 else 's'}"


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
        rows.append(
            {
                "job_id": job["job_id"],
                "name": job.get("name"),
                "status": display_state(job)[0],
                "base_model": trainer["base_model"],
                "lr": trainer_setting(trainer, "optimizer", "lr"),
                "lora_r": trainer_setting(trainer, "lora", "r"),
                "lora_alpha": trainer_setting(trainer, "lora", "alpha"),
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


def usage_frame(stats: dict[str, Any]) -> pd.DataFrame:
    """`GET /v1/stats`'s device-seconds as `%cortex usage` shows them: per user, then per job, most first."""
    import pandas as pd

    device = stats["device_seconds"]
    rows = [
        {"per": "user", "name": name, "device_seconds": seconds}
        for name, seconds in sorted(device["by_owner"].items(), key=lambda item: -item[1])
    ]
    rows += [
        {"per": "job", "name": name, "device_seconds": seconds}
        for name, seconds in sorted((device.get("by_job") or {}).items(), key=lambda item: -item[1])
    ]
    frame = pd.DataFrame(rows, columns=["per", "name", "device_seconds"])
    frame["device_hours"] = frame["device_seconds"] / 3600
    return frame


def stats_frame(stats: dict[str, Any]) -> pd.DataFrame:
    """`GET /v1/stats` as one row per figure: jobs and runs by state, queue wait, device-hours by owner
    and by model (the figures the backend computed; hours are its seconds / 3600)."""
    import pandas as pd

    rows = []
    for kind in ("jobs", "runs"):
        for state, count in stats[kind]["by_state"].items():
            rows.append({"section": f"{kind} by state", "name": state, "value": count})
        rows.append({"section": f"{kind} by state", "name": "total", "value": stats[kind]["total"]})
    wait = stats["queue_wait"]
    rows.append({"section": "queue wait (s)", "name": "started", "value": wait["count"]})
    rows.append({"section": "queue wait (s)", "name": "median", "value": wait["median_s"]})
    rows.append({"section": "queue wait (s)", "name": "p95", "value": wait["p95_s"]})
    device = stats["device_seconds"]
    for key, section in (("by_owner", "device-hours by owner"), ("by_model", "device-hours by model")):
        for name, seconds in device[key].items():
            rows.append({"section": section, "name": name, "value": seconds / 3600})
    rows.append({"section": "device-hours", "name": "total", "value": device["total"] / 3600})
    return pd.DataFrame(rows, columns=["section", "name", "value"])
