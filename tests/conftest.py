"""Shared fixtures: a small registered model, a real backend on loopback, clients."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cortex_nb import Client

from .backend_process import BackendProcess, start_backend
from .model_factory import build_gpt2_dir

os.environ.setdefault("CORTEX_DISABLE_TELEMETRY", "1")


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory) -> Path:
    return build_gpt2_dir(tmp_path_factory.mktemp("models") / "small-gpt2")


@pytest.fixture(scope="session")
def backend(tmp_path_factory, gpt2_dir) -> BackendProcess:
    """One backend for the session: `tiny` plus the registered `small-gpt2`, 8 CPU slots."""
    process = start_backend(
        tmp_path_factory.mktemp("backend"), "--model", f"small-gpt2={gpt2_dir}", "--devices", "cpu:8", "--worker-threads", "1"
    )
    yield process
    process.stop()


@pytest.fixture
def client(backend) -> Client:
    with Client(backend.url, backend.token) as client:
        yield client


