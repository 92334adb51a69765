"""The Cortex Training SDK surface and TLS, as ratios measured in the same run.

    python bench/bench_cortex_sdk.py [--repeats N]

- forward_backward + its result through the published SDK (DSSST1 chunk group, poll) vs through
  cortex_nb.Client (our frame, long-poll), same batch (tiny, 8x128), same job, alternating call by call
- how long the SDK takes to raise a permanent error (unknown job): one request, no retries
- a no-op round trip over TLS (HTTPS, pinned certificate, kept-alive connection) vs plain HTTP: GET /version,
  and a no-op request through the worker; plus GET /version on a new connection each time (TLS handshake)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # they would override the SDK's verify_ssl=False
    os.environ.pop(name, None)
os.environ["CORTEX_TRAINING_DISABLE_TELEMETRY"] = "1"
warnings.filterwarnings("ignore")

from cortex_nb import Client  # noqa: E402
from cortex_nb.tls import httpx_verify  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402


def elapsed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def row(label: str, value: float, digits: int = 2) -> None:
    print(f"{label:66s} {value:12.{digits}f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    import requests
    import torch
    from cortex_training import CortexTrainingClient, SubJobConfig, serialize_forward_backward_args

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, size=(8, 129))
    ours_batch = {
        "input_ids": tokens[:, :-1],
        "target_tokens": tokens[:, 1:],
        "weights": np.ones((8, 128), np.float32),
    }
    sdk_frame = serialize_forward_backward_args(
        (), {"input_ids": torch.from_numpy(tokens[:, :-1]), "labels": torch.from_numpy(tokens[:, 1:])}
    )
    median = statistics.median
    with tempfile.TemporaryDirectory() as plain_dir, tempfile.TemporaryDirectory() as tls_dir:
        plain = start_backend(Path(plain_dir), "--devices", "cpu:1")
        secure = start_backend(Path(tls_dir), "--devices", "cpu:1", "--tls", "self-signed")
        try:
            ours = Client(secure.url, secure.token, verify=secure.fingerprint)
            sdk = CortexTrainingClient.from_pat(
                secure.url.removeprefix("https://"), secure.token, "DB", "SCHEMA", verify_ssl=False
            )
            job_id = sdk.create_job(
                [
                    SubJobConfig.training_job(
                        "tiny",
                        optimizer={"lr": 1e-4},
                        max_seq_len=256,
                        train_batch_size=8,
                        n_gpus=1,
                        extra_training={"peft_config": {"peft_type": "LORA", "r": 16, "lora_alpha": 32}},
                    )
                ]
            )
            sdk.wait_for_job(job_id)
            for _ in range(2):  # warm-up, both paths
                sdk.poll_request(job_id, sdk.forward_backward(job_id, sdk_frame))
                ours.poll_request(job_id, ours.forward_backward(job_id, ours_batch))
            via_sdk, via_ours = [], []
            for _ in range(args.repeats):
                via_sdk.append(
                    elapsed(lambda: sdk.poll_request(job_id, sdk.forward_backward(job_id, sdk_frame)))
                )
                via_ours.append(
                    elapsed(lambda: ours.poll_request(job_id, ours.forward_backward(job_id, ours_batch)))
                )
            refused = []  # a permanent mistake: the SDK must surface it at once, not retry it for a minute
            for _ in range(args.repeats):
                started = time.perf_counter()
                try:
                    sdk.step("job-does-not-exist")
                except requests.HTTPError:
                    refused.append(time.perf_counter() - started)
            sdk.cancel_job(job_id)

            plain_client = Client(plain.url, plain.token)
            jobs = {
                "tls": ours.create_job([{"type": "sampling", "base_model": "tiny"}])["job_id"],
                "plain": plain_client.create_job([{"type": "sampling", "base_model": "tiny"}])["job_id"],
            }
            ours.wait_for_job(jobs["tls"], ("running",))
            plain_client.wait_for_job(jobs["plain"], ("running",))
            version = {"tls": [], "plain": []}
            fresh = {"tls": [], "plain": []}
            noop = {"tls": [], "plain": []}
            # Contexts made once: a new connection then costs the TCP (+ TLS) handshake, not loading CA files.
            pinned, unused = httpx_verify(secure.fingerprint), httpx_verify(False)
            with httpx.Client(verify=pinned) as https, httpx.Client() as http:
                for _ in range(args.repeats * 5):
                    version["tls"].append(elapsed(lambda: https.get(secure.url + "/version")))
                    version["plain"].append(elapsed(lambda: http.get(plain.url + "/version")))
                    fresh["tls"].append(elapsed(lambda: httpx.get(secure.url + "/version", verify=pinned)))
                    fresh["plain"].append(elapsed(lambda: httpx.get(plain.url + "/version", verify=unused)))
                    noop["tls"].append(
                        elapsed(lambda: ours.poll_request(jobs["tls"], ours.noop(jobs["tls"])))
                    )
                    noop["plain"].append(
                        elapsed(
                            lambda: plain_client.poll_request(jobs["plain"], plain_client.noop(jobs["plain"]))
                        )
                    )
            ours.cancel_job(jobs["tls"])
            plain_client.cancel_job(jobs["plain"])
        finally:
            plain.stop()
            secure.stop()

    print(f"{'measure (medians)':66s} {'value':>12s}")
    row("forward_backward 8x128 + result via the cortex-training SDK (ms)", median(via_sdk) * 1000)
    row("forward_backward 8x128 + result via cortex_nb.Client (ms)", median(via_ours) * 1000)
    row("  ratio SDK / cortex_nb.Client (goal <= 1.10)", median(via_sdk) / median(via_ours))
    row("refused call (unknown job) via the SDK, slowest (ms; goal < 2000)", max(refused) * 1000)
    row("GET /version, kept-alive connection, HTTPS (ms)", median(version["tls"]) * 1000)
    row("GET /version, kept-alive connection, HTTP (ms)", median(version["plain"]) * 1000)
    row("  ratio TLS / plain", median(version["tls"]) / median(version["plain"]))
    row("no-op request through the worker, HTTPS (ms)", median(noop["tls"]) * 1000)
    row("no-op request through the worker, HTTP (ms)", median(noop["plain"]) * 1000)
    row("  ratio TLS / plain", median(noop["tls"]) / median(noop["plain"]))
    row("GET /version on a new connection each time, HTTPS (ms)", median(fresh["tls"]) * 1000)
    row("GET /version on a new connection each time, HTTP (ms)", median(fresh["plain"]) * 1000)
    row("  ratio TLS / plain (handshake included)", median(fresh["tls"]) / median(fresh["plain"]))


if __name__ == "__main__":
    main()
