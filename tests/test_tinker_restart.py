"""A Tinker training client across a backend restart, through the published SDK: SIGTERM saves its state
(`drained`) and the next start brings its job back; the SDK process from before the restart goes on
training the same model id, and lands where a client never restarted does."""

from __future__ import annotations

import signal

import numpy as np

from .backend_process import start_backend
from .test_surviving_restarts import free_port
from .test_tinker_parking import train_step
from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL
from .tokens import create_token

pytestmark = NEEDS_SDK


def backend_on(data_dir, port, llama_dir):
    return start_backend(
        data_dir,
        *("--model", f"{TINKER_MODEL}={llama_dir}", "--devices", "cpu:2", "--worker-threads", "1"),
        *("--park-idle-s", "0", "--port", str(port)),
    )


def test_a_training_client_goes_on_after_a_sigterm_restart(tmp_path, llama_dir):
    import tinker

    data_dir, port = tmp_path / "data", free_port()
    first, second = backend_on(data_dir, port, llama_dir), None
    key = create_token(first.data_dir, "restart-user", "jobs:read", "jobs:write", tinker=True)
    service = tinker.ServiceClient(base_url=first.url, api_key=key)
    try:
        reference = service.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=3)
        expected = [train_step(reference, offset) for offset in range(3)]
        client = service.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=3)
        got = [train_step(client, offset) for offset in range(2)]
        first.process.send_signal(signal.SIGTERM)
        first.process.wait(120)
        assert first.process.returncode == 0
        second = backend_on(data_dir, port, llama_dir)
        got.append(train_step(client, 2))
        for (loss, logprobs), (want_loss, want_logprobs) in zip(got, expected, strict=True):
            assert abs(loss - want_loss) <= 1e-5 * max(1.0, abs(want_loss))
            np.testing.assert_allclose(logprobs, want_logprobs, rtol=0, atol=1e-5)
    finally:
        for backend in (first, second):
            if backend is not None:
                backend.stop()
