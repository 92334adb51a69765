"""A custom loss run on the server (`create_custom_loss`, one forward+backward pass) against the same loss run
client-side by `forward_backward_custom` (a `forward`, the loss on the client, a weighted `cross_entropy`), as a
ratio of medians in one run: same backend, same batch (tiny, 8 x 128 tokens), alternating call by call.

    python bench/bench_tinker_custom_loss.py [--repeats N]
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

from tests.backend_process import start_backend  # noqa: E402
from tests.tokens import create_token  # noqa: E402

MODEL, RANK, ROWS, LENGTH = "tiny", 16, 8, 128


def policy_loss(logprobs, advantages):
    loss = -(logprobs * advantages).sum() + 0.1 * (logprobs**2).mean()
    return loss, {"custom/policy:sum": loss}


def client_side(data, logprobs_list):
    total = 0.0
    for datum, logprobs in zip(data, logprobs_list, strict=True):
        total = total + policy_loss(logprobs, datum.loss_fn_inputs["advantages"].to_torch())[0]
    return total, {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    import tinker
    import torch
    from tinker import types

    generator = torch.Generator().manual_seed(0)
    data = []
    for _ in range(ROWS):
        tokens = torch.randint(1, 250, (LENGTH + 1,), generator=generator)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
                loss_fn_inputs={
                    "target_tokens": types.TensorData.from_torch(tokens[1:]),
                    "advantages": types.TensorData.from_torch(torch.randn(LENGTH, generator=generator)),
                },
            )
        )
    with tempfile.TemporaryDirectory() as data_dir:
        backend = start_backend(Path(data_dir), "--devices", "cpu:4", "--worker-threads", "1")
        try:
            key = create_token(backend.data_dir, "bench", "jobs:read", "jobs:write", tinker=True)
            service = tinker.ServiceClient(base_url=backend.url, api_key=key)
            training = service.create_lora_training_client(base_model=MODEL, rank=RANK, seed=0).result()
            handle = service.create_custom_loss(policy_loss, {"logprobs": 1, "advantages": 1}).result()
            server, client = [], []
            for repeat in range(args.repeats + 1):  # the first round warms up
                for times, loss in ((server, handle), (client, client_side)):
                    started = time.perf_counter()
                    training.forward_backward_custom(data, loss).result()
                    if repeat:
                        times.append(time.perf_counter() - started)
            service.close("success").result()
        finally:
            backend.stop()
    server_s, client_s = statistics.median(server), statistics.median(client)
    print(f"custom loss on the server, median s/step:            {server_s:.3f}")
    print(f"forward_backward_custom client-side, median s/step: {client_s:.3f}")
    print(
        f"server / client-side: {server_s / client_s:.2f} ({args.repeats} steps each, {ROWS} x {LENGTH} tokens)"
    )


if __name__ == "__main__":
    main()
