"""Jobs in the Cortex SDK's words and ours: `sub_job_configs` to a cortex-nb job spec, a cortex-nb job
to the SDK's job JSON, and the two spellings of sub-job ids and states.

Only what has a meaning here is translated; a setting that asks for something cortex-nb cannot do
(several GPUs per sub-job, full fine-tuning, multiplexing, create-time checkpoint loading) is refused
with a message naming what to do instead, never silently ignored.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError

from .errors import not_supported

# our sub-job type -> the SDK's id segment ("{job_id}:{segment}:{index}")
ID_SEGMENTS = {states.TRAINING: "training", states.SAMPLING: "sampling", states.LOG_PROBABILITY: "log_prob"}
SEGMENT_TYPES = {segment: kind for kind, segment in ID_SEGMENTS.items()}
JOB_TYPES = (states.TRAINING, states.SAMPLING, states.LOG_PROBABILITY)
# our job states -> the SDK's (its wait_for_job stops on failed/done/cancelled; "terminated" is never used)
JOB_STATES = {
    states.JOB_PENDING: "pending",
    states.JOB_STARTING: "placing",
    states.JOB_RUNNING: "running",
    states.JOB_DONE: "done",
    states.JOB_FAILED: "failed",
    states.JOB_CANCELLED: "cancelled",
}
SDK_JOB_STATES = {sdk: ours for ours, sdk in JOB_STATES.items()}
DEFAULT_LORA = {"r": 16, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}

TOP_KEYS = {
    "sub_job_configs",
    "job_id",
    "experiment_name",
    "hardware",
    "idle_timeout_seconds",
    "pending_timeout_seconds",
    "debug",
}
SUB_KEYS = {
    "job_type",
    "model_name",
    "training_config",
    "inference_config",
    "global_batch_size",
    "dtype",
    "seed",
    "model_post_init",
    "source_checkpoint_info",
}
TRAINING_KEYS = {
    "optimizer",
    "max_seq_len",
    "train_batch_size",
    "n_gpus",
    "gradient_clipping",
    "multiplex_job_id",
    "load_optimizer_states",
    "peft_config",
}
# Settings of the SDK's distributed trainer with no counterpart on one device; accepted, recorded, inert.
INERT_TRAINING_KEYS = {
    "step_peak_memory_log",
    "training_memory_telemetry",
    "activation_checkpointing",
    "ac_config",
    "cuda_allocator_conf",
}
INFERENCE_KEYS = {"max_seq_len", "n_gpus", "multiplex_job_id", "peft_config", "gpu_memory_utilization"}
OPTIMIZER_KEYS = {"name", "lr", "betas", "eps", "weight_decay"}


def sdk_sub_job_id(job_id: str, our_id: str) -> str:
    kind, _, index = our_id.rpartition("-")
    return f"{job_id}:{ID_SEGMENTS.get(kind, kind)}:{index}"


def our_sub_job_id(job: dict[str, Any], value: Any, field: str) -> str:
    """A sub-job named either way (`JOB:training:0` or `training-0`), checked to belong to `job`."""
    text = str(value)
    match = re.fullmatch(r"(?:(?P<job>.+):)?(?P<segment>training|sampling|log_prob):(?P<index>\d+)", text)
    if match and (match["job"] in (None, job["id"])):
        text = f"{SEGMENT_TYPES[match['segment']]}-{match['index']}"
    ids = [sub["id"] for sub in job["sub_jobs"]]
    if text not in ids:
        raise ApiError(
            "invalid_field",
            f"{field}: job {job['id']} has no sub-job {value!r}; it has "
            f"{[sdk_sub_job_id(job['id'], i) for i in ids]}",
            {"field": field},
        )
    return text


def iso(timestamp: float | None) -> str:
    if not timestamp:
        return ""
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _field(message: str, field: str) -> ApiError:
    return ApiError("invalid_field", f"{field}: {message}", {"field": field})


def _dict(value: Any, field: str, allowed: set[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _field("must be an object", field)
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise _field(
            f"{unknown[0]!r} is not a setting cortex-nb knows; it takes {sorted(allowed)}",
            f"{field}.{unknown[0]}",
        )
    return value


def _n_gpus(config: dict[str, Any], field: str) -> int:
    """The sub-job's `n_gpus`: a training sub-job runs as that many ranks (FSDP2), a sampling one as one vLLM
    engine of that tensor-parallel size where the devices sample with vLLM (else `multi_gpu_sampling_unsupported`)."""
    n_gpus = config.get("n_gpus", 1)
    if not isinstance(n_gpus, int) or isinstance(n_gpus, bool) or n_gpus < 1:
        raise _field("must be a positive integer", f"{field}.n_gpus")
    if config.get("multiplex_job_id") is not None:
        raise not_supported(
            f"{field}.multiplex_job_id: sub-jobs are not multiplexed across jobs here; put the"
            " sampling and training sub-jobs in one job",
            f"{field}.multiplex_job_id",
        )
    return n_gpus


def _lora(peft: Any, field: str) -> dict[str, Any]:
    if peft is None:
        return dict(DEFAULT_LORA)
    peft = _dict(
        peft, field, {"peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "bias", "task_type"}
    )
    if str(peft.get("peft_type", "LORA")).upper() != "LORA":
        raise not_supported(
            f"{field}.peft_type={peft['peft_type']!r}: cortex-nb trains LoRA adapters", f"{field}.peft_type"
        )
    if peft.get("bias", "none") != "none":
        raise not_supported(
            f"{field}.bias: cortex-nb LoRA adapters train no biases (bias='none')", f"{field}.bias"
        )
    lora = dict(DEFAULT_LORA)
    for ours, theirs in (
        ("r", "r"),
        ("alpha", "lora_alpha"),
        ("dropout", "lora_dropout"),
        ("target_modules", "target_modules"),
    ):
        if peft.get(theirs) is not None:
            lora[ours] = peft[theirs]
    if "lora_alpha" not in peft and "r" in peft:
        lora["alpha"] = lora["r"]  # the server default the SDK documents: alpha follows r
    return lora


def _optimizer(config: dict[str, Any], field: str) -> dict[str, Any]:
    optimizer = _dict(config.get("optimizer"), f"{field}.optimizer", OPTIMIZER_KEYS)
    name = str(optimizer.get("name", "AdamW"))
    if name.lower() not in ("adamw", "adam_w"):
        raise not_supported(
            f"{field}.optimizer.name={name!r}: cortex-nb trains with AdamW", f"{field}.optimizer.name"
        )
    ours = {key: optimizer[key] for key in ("lr", "betas", "eps", "weight_decay") if key in optimizer}
    if config.get("gradient_clipping") is not None:
        ours["grad_clip"] = config["gradient_clipping"]
    return ours


def job_spec(body: Any, database: str, schema: str) -> dict[str, Any]:
    """A `POST /v1/jobs` body for the SDK's create-job body (the service validates it further)."""
    body = _dict(body, "body", TOP_KEYS)
    if body.get("debug"):
        raise not_supported("debug: create-job debug options exist only on Snowflake's service", "debug")
    configs = body.get("sub_job_configs")
    if not isinstance(configs, list) or not configs:
        raise _field("must be a non-empty list of sub-job configs", "sub_job_configs")
    sub_jobs = []
    for i, config in enumerate(configs):
        field = f"sub_job_configs[{i}]"
        config = _dict(config, field, SUB_KEYS)
        kind = config.get("job_type")
        if kind not in JOB_TYPES:
            raise _field(f"must be one of {list(JOB_TYPES)}, got {kind!r}", f"{field}.job_type")
        if not isinstance(config.get("model_name"), str) or not config["model_name"]:
            raise _field(
                "is required: a model registered on this backend (GET /v1/models)", f"{field}.model_name"
            )
        if config.get("source_checkpoint_info") is not None:
            raise not_supported(
                f"{field}.source_checkpoint_info: start the job, then client.load(job_id, checkpoint_id,"
                " source_job_id=...) once wait_for_job returns",
                f"{field}.source_checkpoint_info",
            )
        if config.get("model_post_init"):
            raise not_supported(
                f"{field}.model_post_init: post-init hooks do not exist here", f"{field}.model_post_init"
            )
        sub: dict[str, Any] = {"type": kind, "base_model": config["model_name"]}
        if config.get("seed") is not None:
            sub["seed"] = config["seed"]
        if kind == states.TRAINING:
            training = _dict(
                config.get("training_config"), f"{field}.training_config", TRAINING_KEYS | INERT_TRAINING_KEYS
            )
            if config.get("inference_config") is not None:
                raise _field("a training sub-job takes training_config", f"{field}.inference_config")
            n_gpus = _n_gpus(training, f"{field}.training_config")
            sub["optimizer"] = _optimizer(training, f"{field}.training_config")
            sub["lora"] = _lora(training.get("peft_config"), f"{field}.training_config.peft_config")
            max_seq_len = training.get("max_seq_len")
        else:
            inference = _dict(config.get("inference_config"), f"{field}.inference_config", INFERENCE_KEYS)
            if config.get("training_config") is not None:
                raise _field(f"a {kind} sub-job takes inference_config", f"{field}.training_config")
            n_gpus = _n_gpus(inference, f"{field}.inference_config")
            if inference.get("peft_config") is not None:
                sub["lora"] = _lora(inference["peft_config"], f"{field}.inference_config.peft_config")
            max_seq_len = inference.get("max_seq_len")
        if max_seq_len is not None:
            sub["max_seq_len"] = max_seq_len
        if n_gpus > 1:
            sub["n_gpus"] = n_gpus
        sub_jobs.append(sub)
    spec: dict[str, Any] = {
        "sub_jobs": sub_jobs,
        "labels": {"database": database, "schema": schema, "api": "cortex-training"},
    }
    if body.get("job_id") is not None:
        spec["job_id"] = body["job_id"]
    if body.get("experiment_name") is not None:
        spec["experiment"] = body["experiment_name"]
    if body.get("hardware") is not None:
        spec["labels"]["hardware"] = str(body["hardware"])[:200]
    idle = body.get("idle_timeout_seconds")
    if idle is not None:
        spec["idle_timeout_s"] = idle
    return spec


def sdk_job(job: dict[str, Any]) -> dict[str, Any]:
    """The SDK's job JSON for one of our (public) jobs."""
    job_id = job["job_id"]
    sub_jobs = []
    # Sampling before log-probability sub-jobs: the SDK reads the first inference_config it meets as the
    # generate window, and generate runs on the sampling sub-job.
    order = {states.TRAINING: 0, states.SAMPLING: 1, states.LOG_PROBABILITY: 2}
    for sub in sorted(job["sub_jobs"], key=lambda s: order.get(s["type"], 3)):
        lora = sub.get("lora") or {}
        peft = (
            {
                "peft_type": "LORA",
                "r": lora.get("r"),
                "lora_alpha": lora.get("alpha"),
                "lora_dropout": lora.get("dropout"),
                "target_modules": lora.get("target_modules"),
            }
            if lora
            else None
        )
        max_seq_len = sub.get("max_seq_len") or (sub.get("info") or {}).get("max_seq_len")
        n_gpus = len((sub.get("info") or {}).get("ranks") or ()) or 1  # a sub-job across devices: its ranks
        row: dict[str, Any] = {
            "sub_job_id": sdk_sub_job_id(job_id, sub["sub_job_id"]),
            "job_type": sub["type"],
            "status": JOB_STATES.get(sub["status"], sub["status"]),
            "model_name": sub["base_model"],
            "device": sub.get("device"),
            "reason": sub.get("failure_message") or "",
        }
        if sub["type"] == states.TRAINING:
            optimizer = dict(sub.get("optimizer") or {})
            row["training_config"] = {
                "optimizer": {"name": "AdamW", **{k: v for k, v in optimizer.items() if k != "grad_clip"}},
                "gradient_clipping": optimizer.get("grad_clip"),
                "max_seq_len": max_seq_len,
                "n_gpus": n_gpus,
                "peft_config": peft,
            }
        else:
            row["inference_config"] = {"max_seq_len": max_seq_len, "n_gpus": 1, "peft_config": peft}
        sub_jobs.append(row)
    labels = job.get("labels") or {}
    return {
        "job_id": job_id,
        "status": JOB_STATES.get(job["status"], job["status"]),
        "reason": (f"{job['failure_code']}: {job['failure_message']}" if job.get("failure_code") else "")
        or "",
        "created_at": iso(job.get("created_at")),
        "updated_at": iso(job.get("finished_at") or job.get("last_activity_at") or job.get("created_at")),
        "image_tag": "",
        "experiment_name": job.get("experiment") or "",
        "database": labels.get("database", ""),
        "schema": labels.get("schema", ""),
        "idle_timeout_seconds": job.get("idle_timeout_s"),
        "sub_jobs": sub_jobs,
    }
