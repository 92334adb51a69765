"""The environment a worker runs in, whichever executor starts it: what it must never inherit (credentials,
the backend's own configuration) and the settings every worker runs with."""

from __future__ import annotations

import os

from ..devices import Device

# Variables a worker must never inherit: credentials and the backend's own configuration.
SCRUBBED_ENV_PREFIXES = (
    "CORTEX_",
    "JUPYTER",
    "JPY_",
    "AWS_",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "GITHUB_TOKEN",
    # Ray's token (ray_cluster/cluster_token.py): Ray's own processes get it back, nothing else does.
    "RAY_AUTH_TOKEN",
)


# Settings every worker runs with, whichever executor starts it.
WORKER_ENV = {
    "PYTHONUNBUFFERED": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    # Library deprecation notices are not the user's to act on; they drown the job's own lines.
    "PYTHONWARNINGS": "ignore::FutureWarning",
}
# Sleeping, not spinning, between parallel regions: several CPU workers (and anything else) share
# the cores, and spinning OpenMP threads make a loaded host ten times slower (bench_core measures it).
WORKER_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


def scrubbed_environment() -> dict[str, str]:
    """This process's environment without credentials or the backend's own configuration."""
    return {key: value for key, value in os.environ.items() if not key.startswith(SCRUBBED_ENV_PREFIXES)}


def worker_environment(device: Device) -> dict[str, str]:
    env = scrubbed_environment()
    env.update(WORKER_ENV)
    for key, value in WORKER_ENV_DEFAULTS.items():
        env.setdefault(key, value)
    env.update(device.worker_env())
    return env
