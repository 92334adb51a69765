"""reset_prefix_cache: through the published cortex-training SDK (its `reset-prefix-cache` operation, a
501 before) and our own client, queued behind the sub-job's earlier requests, answered by the engine that
samples (the built-in engine, which holds no prefix between calls and says so)."""

from __future__ import annotations

import pytest
from cortex_training import SubJobConfig

from cortex_nb import Client

from .notebook_fixtures import wait_until
from .test_cortex_sdk import LORA, sdk  # noqa: F401  (the SDK fixture)

pytestmark = pytest.mark.filterwarnings(
    "ignore::urllib3.exceptions.InsecureRequestWarning",
    "ignore:The 'initial' parameter is deprecated:DeprecationWarning",
)


def test_reset_prefix_cache_through_the_cortex_sdk_and_our_client(sdk, tls_backend):  # noqa: F811
    trainer = SubJobConfig.training_job(
        "tiny",
        optimizer={"name": "AdamW", "lr": 1e-2},
        max_seq_len=64,
        train_batch_size=1,
        n_gpus=1,
        extra_training={"peft_config": LORA},
    )
    sampler = SubJobConfig.sampling_job(
        "tiny", max_seq_len=64, n_gpus=1, extra_sampling={"peft_config": LORA}
    )
    job_id = sdk.create_job([trainer, sampler], idle_timeout_seconds=0)
    try:
        sdk.wait_for_job(job_id)
        with Client(tls_backend.url, tls_backend.token, verify=tls_backend.fingerprint) as ours:
            # A generate, then the reset: it runs after the generate on the sampler (one queue per sub-job).
            generated = ours.api.generate(
                job_id, ["abc"], {"max_tokens": 4, "temperature": 0.0}, sub_job="sampling-0"
            )["request_id"]
            submitted = sdk.reset_prefix_cache(job_id)
            result = sdk.poll_request(job_id, submitted["request_id"])
            assert result["reset"] is True and result["engine"] == "transformers"
            assert result["cached_prefixes_dropped"] == 0 and "keeps no prefix cache" in result["detail"]
            requests = {row["request_id"]: row for row in ours.list_requests(job_id)}
            reset_row = requests[submitted["request_id"]]
            assert reset_row["op"] == "reset_prefix_cache" and reset_row["sub_job_id"] == "sampling-0"
            assert reset_row["started_at"] >= requests[generated]["finished_at"]
            # Our own client: the same operation on the trainer's engine, by name.
            mine = ours.reset_prefix_cache(job_id, sub_job="training-0")
            assert mine["reset"] is True and mine["engine"] == "transformers"
            wait_until(
                lambda: (
                    sum(
                        "prefix cache reset (transformers)" in line["line"]
                        for line in ours.tail_logs(job_id, limit=1000)["lines"]
                    )
                    == 2
                ),
                30,
            )
    finally:
        sdk.cancel_job(job_id)
