"""Checkpoint lifecycle calls, the published tinker SDK against cortex_nb.Client, as ratios in one run.

    python bench/bench_tinker_lifecycle.py [--repeats N]

Same backend, same checkpoint, calls alternating one by one; the median seconds of each and the ratio SDK / ours:
- set a TTL (`set_checkpoint_ttl_from_tinker_path` vs `Client.set_checkpoint_ttl`)
- publish + unpublish (`publish_/unpublish_checkpoint_from_tinker_path` vs `Client.publish_checkpoint` twice)
- copy (`RestClient.copy_weights` vs `Client.copy_checkpoint`), each copy deleted again outside the timing
- a session search and a trace export URL (SDK only: our own API has no sessions)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

from cortex_nb import Client  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402
from tests.tokens import create_token  # noqa: E402


def elapsed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    import tinker
    from tinker import types

    median = statistics.median
    with tempfile.TemporaryDirectory() as data_dir:
        backend = start_backend(Path(data_dir), "--devices", "cpu:2", "--worker-threads", "1")
        try:
            key = create_token(backend.data_dir, "bench", "jobs:read", "jobs:write", tinker=True)
            service = tinker.ServiceClient(base_url=backend.url, api_key=key)
            rest = service.create_rest_client()
            training = service.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
            path = training.save_state("bench").result().path
            job_id, checkpoint_id = training.model_id.replace(":", "."), "bench"
            ours = Client(backend.url, key)
            timings: dict[str, tuple[list[float], list[float]]] = {
                "set a TTL": ([], []),
                "publish + unpublish": ([], []),
                "copy": ([], []),
            }
            for _ in range(args.repeats):
                timings["set a TTL"][0].append(
                    elapsed(lambda: rest.set_checkpoint_ttl_from_tinker_path(path, 7200).result())
                )
                timings["set a TTL"][1].append(
                    elapsed(lambda: ours.set_checkpoint_ttl(job_id, checkpoint_id, 7200))
                )
                timings["publish + unpublish"][0].append(
                    elapsed(
                        lambda: (
                            rest.publish_checkpoint_from_tinker_path(path).result(),
                            rest.unpublish_checkpoint_from_tinker_path(path).result(),
                        )
                    )
                )
                timings["publish + unpublish"][1].append(
                    elapsed(
                        lambda: (
                            ours.publish_checkpoint(job_id, checkpoint_id),
                            ours.publish_checkpoint(job_id, checkpoint_id, False),
                        )
                    )
                )
                started = time.perf_counter()
                copy_path = rest.copy_weights(path, "bench").result()
                timings["copy"][0].append(time.perf_counter() - started)
                started = time.perf_counter()
                our_copy = ours.copy_checkpoint(job_id, checkpoint_id)
                timings["copy"][1].append(time.perf_counter() - started)
                rest.delete_checkpoint_from_tinker_path(copy_path).result()
                ours.delete_checkpoint(our_copy["job_id"], checkpoint_id)
            print(f"{'call':28s} {'SDK s':>10s} {'ours s':>10s} {'SDK/ours':>10s}")
            for name, (sdk, own) in timings.items():
                print(f"{name:28s} {median(sdk):10.4f} {median(own):10.4f} {median(sdk) / median(own):10.2f}")
            search = [
                elapsed(lambda: rest.search_sessions(types.SessionSearchRequest()).result())
                for _ in range(args.repeats)
            ]
            session_id = service.holder.get_session_id()
            trace = [
                elapsed(lambda: rest.export_session_trace(session_id).result()) for _ in range(args.repeats)
            ]
            print(f"{'search_sessions (SDK)':28s} {median(search):10.4f}")
            print(f"{'export_session_trace (SDK)':28s} {median(trace):10.4f}")
            service.close("success").result()
        finally:
            backend.stop()


if __name__ == "__main__":
    main()
