"""With default settings the Jupyter proxy does not act as admin (finding 16 of issue 13): a backend in
the default data dir and a Jupyter server given only the backend's URL; what the proxy forwards with
must be a token without the admin scope, so one Jupyter user cannot see or cancel everyone's jobs."""

from __future__ import annotations

import json

import httpx
import pytest
from traitlets.config import Config

from ..backend_process import start_backend
from ..tokens import create_token


@pytest.fixture
def default_backend(tmp_path, monkeypatch):
    """A backend in the default data dir of a fresh XDG_DATA_HOME (the laptop set-up)."""
    data_home = tmp_path / "share"
    monkeypatch.setenv("XDG_DATA_HOME", str(data_home))
    process = start_backend(data_home / "cortex-nb" / "backend", "--devices", "cpu:1", "--warm-workers", "0")
    yield process
    process.stop()


@pytest.fixture
def jp_server_config(default_backend):
    # No token_file: the extension's default is what this pins.
    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {"cortex_server": True},
                "allow_unauthenticated_access": False,
            },
            "CortexServerApp": {"backend_url": default_backend.url},
        }
    )


async def test_the_proxy_does_not_act_as_admin_by_default(jp_fetch, default_backend):
    someone_else = create_token(default_backend.data_dir, "someone-else", "jobs:read", "runs:write")
    spec = {"version": 1, "name": "not-yours", "command": ["true"]}
    created = httpx.post(
        f"{default_backend.url}/v1/runs",
        json={"spec": spec},
        timeout=60,
        headers={"Authorization": f"Bearer {someone_else}"},
    )
    assert created.status_code == 201, created.text
    listed = json.loads((await jp_fetch("cortex", "api", "v1", "runs")).body)
    # An admin token would list everyone's runs; the proxy's must not see another owner's.
    assert created.json()["run_id"] not in {run["run_id"] for run in listed["runs"]}
