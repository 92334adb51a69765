"""The SDK's own `tinker checkpoint` CLI against the backend: list, info, set-ttl, publish, unpublish and delete (by
path, and in bulk by run, type and date) work."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL

pytestmark = NEEDS_SDK


def cli(backend, key: str, *args: str) -> subprocess.CompletedProcess:
    executable = shutil.which("tinker", path=str(Path(sys.executable).parent))
    assert executable is not None, "the tinker SDK installs a `tinker` command beside its Python"
    env = {**os.environ, "TINKER_BASE_URL": backend.url, "TINKER_API_KEY": key}
    return subprocess.run(
        [executable, "-f", "json", "checkpoint", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_checkpoint_cli_lists_shows_sets_ttls_publishes_and_deletes(service_client, backend, tinker_key):
    import tinker

    training = service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=0).result()
    state = training.save_state("cli-state").result().path
    sampler = training.save_weights_for_sampler("cli-sampler").result().path
    run_id = training.model_id

    listed = cli(backend, tinker_key, "list", "--run-id", run_id)
    assert listed.returncode == 0, listed.stderr
    paths = {checkpoint["tinker_path"] for checkpoint in json.loads(listed.stdout)["checkpoints"]}
    assert {state, sampler} <= paths

    info = cli(backend, tinker_key, "info", state)
    assert info.returncode == 0, info.stderr
    shown = json.loads(info.stdout)
    assert shown["checkpoint_id"] == "weights/cli-state" and shown["lora_rank"] == 4 and shown["is_lora"]

    # lifecycle: a TTL set and cleared, published and unpublished, as the listing then shows
    def listed() -> dict:
        answer = cli(backend, tinker_key, "list", "--run-id", run_id)
        assert answer.returncode == 0, answer.stderr
        return {c["tinker_path"]: c for c in json.loads(answer.stdout)["checkpoints"]}

    assert cli(backend, tinker_key, "set-ttl", state, "--ttl", "7200").returncode == 0
    expires = datetime.fromisoformat(listed()[state]["expires_at"])
    assert timedelta(seconds=7000) < expires - datetime.now(timezone.utc) <= timedelta(seconds=7200)
    assert cli(backend, tinker_key, "set-ttl", state, "--remove").returncode == 0
    assert listed()[state]["expires_at"] is None
    assert cli(backend, tinker_key, "publish", state).returncode == 0 and listed()[state]["public"]
    assert cli(backend, tinker_key, "unpublish", state).returncode == 0 and not listed()[state]["public"]
    short = cli(backend, tinker_key, "set-ttl", state, "--ttl", "60")
    assert short.returncode != 0 and "ttl_seconds" in short.stdout + short.stderr

    # bulk delete by run, type and date: the sampler checkpoint only, then the other by its path
    tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).date().isoformat()
    bulk = cli(
        backend,
        tinker_key,
        "delete",
        "--run-id",
        run_id,
        "--type",
        "sampler_weights",
        "--before",
        tomorrow,
        "-y",
    )
    assert bulk.returncode == 0, bulk.stderr
    left = {
        c["tinker_path"]
        for c in json.loads(cli(backend, tinker_key, "list", "--run-id", run_id).stdout)["checkpoints"]
    }
    assert sampler not in left and state in left
    assert cli(backend, tinker_key, "delete", state, "-y").returncode == 0
    left = json.loads(cli(backend, tinker_key, "list", "--run-id", run_id).stdout)["checkpoints"]
    assert state not in {c["tinker_path"] for c in left}
    with pytest.raises(tinker.NotFoundError):  # the deleted state no longer loads
        service_client.create_training_client_from_state(state).result()


def test_checkpoint_cli_downloads_a_state_as_the_adapter_it_holds(
    service_client, backend, tinker_key, tmp_path
):
    """`download` exports the state through a temporary external-weights checkpoint and signed URLs: the files
    are the state's own adapter files, byte for byte, and the temporary export is deleted afterwards."""
    import httpx
    import tinker

    training = service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=4, seed=3).result()
    state = training.save_state("to-download").result().path
    answer = cli(backend, tinker_key, "download", state, "--output", str(tmp_path))
    assert answer.returncode == 0, answer.stderr
    folder = tmp_path / state.replace("tinker://", "").replace("/", "_")
    saved = next(
        (backend.data_dir / "checkpoints").glob(f"*/{training.model_id.replace(':', '.')}/to-download")
    )
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert (folder / "adapter_model.safetensors").read_bytes() == (
        saved / "adapter_model.safetensors"
    ).read_bytes()
    rest = tinker.RestClient(base_url=backend.url, api_key=tinker_key)
    exports = [
        c
        for c in rest.list_user_checkpoints(limit=1000).result().checkpoints
        if c.checkpoint_type == "external"
    ]
    assert exports == [], "the CLI deletes its temporary export"

    # a URL names one file until it expires: its SHA-256 travels with it, it resumes, and a changed URL is refused
    path = training.save_weights_external("mine").result().path
    urls = rest.get_external_weights_urls(path).result().urls
    with httpx.Client(timeout=60) as http:
        whole = http.get(urls["adapter_model.safetensors"])
        assert whole.status_code == 200
        assert whole.headers["X-Checksum-SHA256"] == hashlib.sha256(whole.content).hexdigest()
        tail = http.get(urls["adapter_model.safetensors"], headers={"Range": "bytes=100-"})
        assert tail.status_code == 206 and tail.content == whole.content[100:]
        forged = urls["adapter_config.json"].replace("adapter_config.json", "adapter_model.safetensors")
        refused = http.get(forged)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "download_link_invalid"
        rest.delete_checkpoint_from_tinker_path(path).result()
        gone = http.get(urls["adapter_config.json"])
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "checkpoint_not_found"


def test_push_hf_fails_offline_before_anything_is_exported(service_client, backend, tinker_key, monkeypatch):
    """push-hf runs in the CLI, not here: it asks the Hugging Face Hub who is logged in first, which an offline
    host cannot reach, so it stops with the CLI's own error and leaves no export behind."""
    import tinker

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    training = service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=4).result()
    path = training.save_state("to-push").result().path
    pushed = cli(backend, tinker_key, "push-hf", path, "--repo", "someone/adapter")
    assert pushed.returncode != 0
    assert "Not logged in" in pushed.stdout + pushed.stderr
    rest = tinker.RestClient(base_url=backend.url, api_key=tinker_key)
    listed = rest.list_user_checkpoints(limit=1000).result().checkpoints
    assert [c for c in listed if c.checkpoint_type == "external"] == []
