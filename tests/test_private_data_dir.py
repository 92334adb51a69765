"""The backend's data dir is private from its first use (`token create` before any `serve` too)."""

from __future__ import annotations

import stat

from .backend_process import start_backend
from .tokens import create_token


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_token_create_before_serve_makes_a_private_data_dir(tmp_path):
    data_dir = tmp_path / "fresh" / "backend"
    create_token(data_dir, "early-bird", "jobs:read")
    assert _mode(data_dir) == 0o700
    for path in data_dir.iterdir():
        assert _mode(path) & 0o077 == 0, f"{path.name} is {oct(_mode(path))}"
    backend = start_backend(data_dir, "--devices", "cpu:1", "--warm-workers", "0")
    try:
        assert _mode(data_dir) == 0o700
        for path in data_dir.iterdir():
            if path.name != "backend.log":  # the test's own capture of stdout
                assert path.is_dir() or _mode(path) & 0o077 == 0, f"{path.name} is {oct(_mode(path))}"
    finally:
        backend.stop()
