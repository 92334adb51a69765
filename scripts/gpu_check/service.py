"""The product itself on the device: a real backend with a trainer and a sampler, a sync, greedy compared.

Its sampler runs the engine `--sampler auto` picks (vLLM on a GPU where it is installed), so this also
shows which engine a plain `cortex-nb backend serve` gives this host. `running_backend` starts the
backends the other product stages (shared base, quantized base, sub-jobs across devices) drive.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .checks import random_batch


def start_backend(
    data_dir: Path, models: dict[str, Path], devices: str, sampler: str, *options: str
) -> tuple[subprocess.Popen, str, str]:
    """`cortex-nb backend serve` on an ephemeral loopback port with `models` registered; `options` are
    further serve flags (`--adapter-host`, `--quantize NAME=nf4`, ...)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log = open(data_dir / "backend.log", "ab")  # noqa: SIM115 - the child owns it
    registered = [flag for name, path in models.items() for flag in ("--model", f"{name}={path}")]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cortex_backend",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            "--devices",
            devices,
            *registered,
            "--sampler",
            sampler,
            "--warm-workers",
            "0",
            *options,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    endpoint = data_dir / "backend.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the backend exited: {(data_dir / 'backend.log').read_text()[-2000:]}")
        if endpoint.exists():
            info = json.loads(endpoint.read_text())
            if info["pid"] == process.pid:
                return process, info["url"], Path(info["token_file"]).read_text().strip()
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the backend did not start within 120 s")


def stop_backend(process: subprocess.Popen) -> None:
    """SIGTERM (the backend drains and stops its workers); its whole session is killed after 30 s."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # its own session: the backend and its workers
        process.wait()


@contextmanager
def running_backend(
    data_dir: Path, models: dict[str, Path], devices: str, *options: str, sampler: str = "transformers"
) -> Iterator[tuple[Any, int]]:
    """(a cortex_nb Client of a started backend, the backend's pid); the backend stops on leaving."""
    from cortex_nb import Client

    process, url, token = start_backend(data_dir, models, devices, sampler, *options)
    try:
        with Client(url, token) as client:
            yield client, process.pid
    finally:
        stop_backend(process)


def sampler_matches_trainer(
    data_dir: Path,
    model_dir: Path,
    devices: str,
    sampler: str,
    vocab: int,
    prompts: list[list[int]],
    tokens: int,
    steps: int,
) -> dict[str, Any]:
    """Train a few steps, sync, and compare the sampler's greedy tokens with the trainer's, through the service."""
    from cortex_nb import Client

    process, url, token = start_backend(data_dir, {"check": model_dir}, devices, sampler)
    try:
        with Client(url, token) as client:
            job = client.create_training_job(
                "check", lora={"r": 16, "alpha": 32}, optimizer={"lr": 1e-3}, samplers=1, seed=1
            )
            try:
                rng = np.random.default_rng(0)
                for _ in range(steps):
                    job.forward_backward(random_batch(rng, vocab, 4, 64))
                    job.step()
                synced = job.sync_sampler().result()
                params = {"max_tokens": tokens, "temperature": 0.0, "ignore_eos": True, "logprobs": True}
                from_trainer = job.generate(prompts, sub_job=job.sub_jobs("training")[0], **params).result()
                from_sampler = job.generate(prompts, sub_job=job.sub_jobs("sampling")[0], **params).result()
                exact = sum(a == b for a, b in zip(from_trainer.tokens, from_sampler.tokens, strict=True))
                return {
                    "sampler_engine": from_sampler.sampler,
                    "sync_path": synced["path"],
                    "sync_ms": synced["ms"],
                    "exact": exact,
                    "prompts": len(prompts),
                    "first_token_logprob_max_abs_diff": max(
                        abs(a["logprobs"][0] - b["logprobs"][0])
                        for a, b in zip(from_trainer.samples, from_sampler.samples, strict=True)
                    ),
                }
            finally:
                job.cancel()
    finally:
        stop_backend(process)
