"""Shared fixtures: a small registered model, a real backend on loopback, clients."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cortex_nb import Client

from .backend_process import BackendProcess, start_backend
from .model_factory import build_char_llama_dir, build_gpt2_dir

os.environ.setdefault("CORTEX_DISABLE_TELEMETRY", "1")
# Backends started by tests refuse to render a reply field their schema does not declare (config.py).
os.environ.setdefault("CORTEX_STRICT_REPLIES", "1")


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory) -> Path:
    return build_gpt2_dir(tmp_path_factory.mktemp("models") / "small-gpt2")


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    return build_char_llama_dir(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def backend(tmp_path_factory, gpt2_dir, llama_dir) -> BackendProcess:
    """One backend for the session, 8 CPU slots: `tiny`, the registered `small-gpt2`, and a small Llama with a
    Hugging Face tokenizer registered under a Hugging Face style name (`cortex-test/tiny-llama`)."""
    process = start_backend(
        tmp_path_factory.mktemp("backend"),
        "--model",
        f"small-gpt2={gpt2_dir}",
        "--model",
        f"cortex-test/tiny-llama={llama_dir}",
        "--devices",
        "cpu:8",
        "--worker-threads",
        "1",
    )
    yield process
    process.stop()


@pytest.fixture
def client(backend) -> Client:
    with Client(backend.url, backend.token) as client:
        yield client


@pytest.fixture(scope="session")
def tls_backend(tmp_path_factory) -> BackendProcess:
    """A backend serving HTTPS with the certificate `--tls self-signed` makes: `tiny`, 4 CPU slots.
    Its `fingerprint` is what clients pin (tests/test_tls.py, the Cortex SDK tests, the proxy test)."""
    process = start_backend(
        tmp_path_factory.mktemp("tls-backend"),
        "--tls",
        "self-signed",
        "--devices",
        "cpu:4",
        "--worker-threads",
        "1",
        "--warm-workers",
        "2",
    )
    yield process
    process.stop()


# source runs -----------------------------------------------------------------------------------
# Planted in the runs backend's environment: a run must never see them (tests/test_runs_sandbox.py).
RUNS_BACKEND_SECRETS = {
    "CORTEX_TOKEN": "ctx_planted-secret-token",
    "HF_TOKEN": "hf_planted-secret",
    "RUNS_TEST_CANARY": "canary-4711",
}


@pytest.fixture(scope="session")
def runs_backend(tmp_path_factory, gpt2_dir) -> BackendProcess:
    """A backend for source runs: 4 CPU slots, a 1 GiB address-space limit (so a memory hog fails
    fast), a 1 s kill grace, and planted secrets in its environment."""
    process = start_backend(
        tmp_path_factory.mktemp("runs-backend"),
        "--model",
        f"small-gpt2={gpt2_dir}",
        "--devices",
        "cpu:4",
        "--warm-workers",
        "0",
        "--run-address-space-mib",
        "1024",
        "--run-kill-grace",
        "1",
        env=RUNS_BACKEND_SECRETS,
    )
    yield process
    process.stop()


@pytest.fixture
def runs_client(runs_backend) -> Client:
    with Client(runs_backend.url, runs_backend.token) as client:
        yield client


# notebook front: an IPython shell with the extension loaded, connected to `backend` ---------------
from .notebook_fixtures import cortex_shell  # noqa: E402,F401

# Tinker face: the tinker SDK against `backend` -------------------------------------------------------
from .tinker_fixtures import hf_home, service_client, tinker_key  # noqa: E402,F401
