"""Parking idle Tinker training clients (`--park-idle-s`), measured through the published SDK, as ratios in one run.

    python bench/bench_tinker_parking.py [--repeats N] [--rounds N]

One backend, 4 CPU slots, the built-in `tiny` model, parking after 1 s idle:
- a step (forward_backward + optim_step) on a warm client vs the same step on a parked client (bringing it back:
  queue, worker start, load of its `parked` checkpoint, then the step); the backend's own `last_restore_s` too
- clients per slot that train at once: 8 clients on 4 slots trained round robin (each step lands on a parked
  client), the seconds per step against 4 clients on the same 4 slots (no client ever waits for a slot)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

from tests.backend_process import start_backend  # noqa: E402
from tests.tokens import create_token  # noqa: E402

SLOTS = 4


def parking_view(backend, client) -> dict:
    job_id = client.model_id.replace(":", ".")
    reply = httpx.get(
        f"{backend.url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {backend.token}"}, timeout=30
    )
    return reply.json()["sub_jobs"][0]["info"].get("parking") or {}


def wait_parked(backend, client) -> None:
    deadline = time.monotonic() + 120
    while not parking_view(backend, client).get("parked"):
        if time.monotonic() > deadline:
            raise RuntimeError("the client was never parked")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import tinker
    from tinker import types

    datum = types.Datum(
        model_input=types.ModelInput.from_ints(list(range(10, 30))),
        loss_fn_inputs={"target_tokens": list(range(11, 31)), "weights": [1.0] * 20},
    )

    def step(client) -> float:
        started = time.perf_counter()
        client.forward_backward([datum], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        return time.perf_counter() - started

    median = statistics.median
    with tempfile.TemporaryDirectory() as data_dir:
        backend = start_backend(
            Path(data_dir), "--devices", f"cpu:{SLOTS}", "--worker-threads", "1", "--park-idle-s", "1"
        )
        try:
            key = create_token(backend.data_dir, "bench", "jobs:read", "jobs:write", tinker=True)
            service = tinker.ServiceClient(base_url=backend.url, api_key=key)
            client = service.create_lora_training_client(base_model="tiny", rank=4, seed=0)
            step(client)
            warm = [step(client) for _ in range(args.repeats)]
            back, reported = [], []
            for _ in range(args.repeats):
                wait_parked(backend, client)
                back.append(step(client))
                reported.append(parking_view(backend, client)["last_restore_s"])
            print(f"warm step:                 {median(warm):.3f} s (median of {args.repeats})")
            print(
                f"step on a parked client:   {median(back):.3f} s (backend's restore: {median(reported):.3f} s)"
            )
            print(f"ratio parked / warm:       {median(back) / median(warm):.1f}x")

            wait_parked(backend, client)  # all 4 slots free for the next measure
            per_step: dict[int, float] = {}
            restores: dict[int, int] = {}
            for count in (SLOTS, 2 * SLOTS):
                clients = [
                    service.create_lora_training_client(base_model="tiny", rank=4, seed=index)
                    for index in range(count)
                ]
                started = time.perf_counter()
                for _ in range(args.rounds):
                    for each in clients:
                        step(each)
                per_step[count] = (time.perf_counter() - started) / (count * args.rounds)
                restores[count] = sum(parking_view(backend, each).get("parks", 0) for each in clients)
                for each in clients:
                    wait_parked(backend, each)  # every slot free again before the next measure
            print(
                f"clients per slot training at once: {2 * SLOTS // SLOTS} ({2 * SLOTS} clients on {SLOTS} slots,"
                f" {args.rounds} round-robin rounds, all finished)"
            )
            print(
                f"seconds per step, {2 * SLOTS} clients vs {SLOTS}: {per_step[2 * SLOTS]:.3f} / {per_step[SLOTS]:.3f}"
                f" = {per_step[2 * SLOTS] / per_step[SLOTS]:.1f}x (parks while training: {restores[2 * SLOTS]}"
                f" vs {restores[SLOTS]}; with more clients than slots a round-robin step mostly waits for"
                " another client to park and for a worker to start)"
            )
            service.close("success").result()
        finally:
            backend.stop()


if __name__ == "__main__":
    main()
