"""Job, sub-job and request states, and the failure codes a job or request can end with.

One definition for the backend, the client, the widgets and (through a generated copy checked by a
test) the sidebar panel.
"""

from __future__ import annotations

# Jobs and sub-jobs: pending -> starting -> running -> done | failed | cancelled
JOB_PENDING = "pending"
JOB_STARTING = "starting"
JOB_RUNNING = "running"
JOB_DONE = "done"
JOB_FAILED = "failed"
JOB_CANCELLED = "cancelled"
JOB_STATES = (JOB_PENDING, JOB_STARTING, JOB_RUNNING, JOB_DONE, JOB_FAILED, JOB_CANCELLED)
JOB_TERMINAL = frozenset({JOB_DONE, JOB_FAILED, JOB_CANCELLED})

# Data-plane requests: queued -> running -> succeeded | failed | cancelled
REQUEST_QUEUED = "queued"
REQUEST_RUNNING = "running"
REQUEST_SUCCEEDED = "succeeded"
REQUEST_FAILED = "failed"
REQUEST_CANCELLED = "cancelled"
REQUEST_STATES = (REQUEST_QUEUED, REQUEST_RUNNING, REQUEST_SUCCEEDED, REQUEST_FAILED, REQUEST_CANCELLED)
REQUEST_TERMINAL = frozenset({REQUEST_SUCCEEDED, REQUEST_FAILED, REQUEST_CANCELLED})

# Sub-job types
TRAINING = "training"
SAMPLING = "sampling"
LOG_PROBABILITY = "log_probability"
SUB_JOB_TYPES = (TRAINING, SAMPLING, LOG_PROBABILITY)

# Which operations each sub-job type serves.
OPERATIONS_BY_TYPE: dict[str, frozenset[str]] = {
    TRAINING: frozenset({"forward_backward", "step", "generate", "forward", "save", "load", "noop"}),
    SAMPLING: frozenset({"generate", "forward", "load", "noop"}),
    LOG_PROBABILITY: frozenset({"forward", "load", "noop"}),
}

# Failure codes a job, sub-job or request ends with. Stable: users match on them.
FAILURE_CODES = {
    "worker_crashed": "the worker process serving the sub-job died",
    "worker_start_failed": "the worker could not load the model or start",
    "backend_restarted": "the backend restarted while this was in flight",
    "cancelled": "cancelled by the user",
    "idle_timeout": "no request arrived within the job's idle timeout",
    "out_of_memory": "the device ran out of memory",
    "invalid_batch": "the batch did not fit the model",
    "operation_failed": "the operation raised an error; see the message",
    # checkpoints and weight sync
    "checkpoint_corrupted": "a checkpoint file no longer matches its SHA-256; it was not loaded",
    "incompatible_adapter": "the weights do not fit the sub-job's adapter (base model, rank or target modules)",
    "quota_exceeded": "the owner's checkpoint quota would be exceeded; nothing was kept",
    "weight_sync_failed": "a sampler could not take the trainer's weights; it kept its previous ones",
    "weight_sync_timeout": "a weight-sync participant did not answer in time",
}

# Failure codes a source run ends with (docs/job-spec.md). Stable: users match on them.
RUN_FAILURE_CODES = {
    "workload_runtime_failed": "the command exited non-zero or was killed by a signal; see exit_code and the logs",
    "workload_out_of_memory": "the workload ran out of memory (the run's memory limit, its address-space limit, or the device's)",
    "disk_quota_exceeded": "the run's work dir passed its quota (--run-disk-mib) and the run was stopped",
    "output_missing": "a required output was not written",
    "output_too_large": "an output is larger than its max_bytes",
    "timed_out": "the run passed its timeout_seconds and was stopped",
    "cancelled": "cancelled by the user",
    "isolation_unsupported": "isolation: required, and this host cannot give the run its sandbox or per-run limits",
    "spec_invalid": "the spec was refused",
    "sandbox_failed": "the backend could not set up the run's sandbox; see the message",
    "backend_restarted": "the backend restarted while the run was in flight",
}
