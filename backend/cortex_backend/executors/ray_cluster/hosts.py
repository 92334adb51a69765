"""Which hosts are up, read on the head: Ray's live nodes joined with the records hosts published.

A host's devices get ids prefixed with its name ("gpu-box-2/cuda:0", "laptop/cpu"), so samples, sub-job
placements and capacity stay unambiguous across machines. Each host's models become catalog entries on
the head whose directory holds only the config and tokenizer files (the weights stay on the host).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...devices import Device
from ...models import TINY, ModelInfo
from .registry import HOST_RESOURCE_PREFIX, ClusterStore

log = logging.getLogger("cortex_backend.executors.ray_cluster")

SAFE_FILE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Host:
    name: str
    node_id: str
    address: str
    devices: tuple[Device, ...]
    # model name -> its directory on that host
    model_paths: tuple[tuple[str, str], ...]

    def model_path(self, model: str) -> str | None:
        return dict(self.model_paths).get(model)


def devices_of(record: dict[str, Any]) -> tuple[Device, ...]:
    """A host record's devices as the scheduler sees them: ids prefixed with the host, models attached."""
    name = record["name"]
    models = frozenset({TINY, *record.get("models", {})})
    devices = []
    for entry in record.get("devices", []):
        local_id = "cpu" if entry["kind"] == "cpu" else f"cuda:{entry['index']}"
        devices.append(
            Device(
                f"{name}/{local_id}",
                entry["kind"],
                entry.get("index"),
                entry["name"],
                entry.get("memory_bytes"),
                int(entry["slots"]),
                name,
                models,
            )
        )
    return tuple(devices)


def live_nodes() -> dict[str, dict[str, Any]]:
    """Alive Ray nodes by the host name their `cortex-host:` resource gives."""
    import ray

    nodes = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        for resource in node.get("Resources", {}):
            if resource.startswith(HOST_RESOURCE_PREFIX):
                nodes[resource[len(HOST_RESOURCE_PREFIX) :]] = node
    return nodes


def node_is_alive(node_id: str) -> bool:
    import ray

    return any(node["NodeID"] == node_id and node.get("Alive") for node in ray.nodes())


class ClusterHosts:
    """The hosts up now, and the head's copies of their models' config and tokenizer files."""

    def __init__(self, store: ClusterStore, model_files_dir: Path) -> None:
        self.store = store
        self.model_files_dir = model_files_dir
        self._records: dict[tuple[str, str], dict[str, Any]] = {}  # (name, node id) -> record

    def read(self) -> dict[str, Host]:
        """The hosts up now (blocking: Ray and GCS calls; run it off the IO loop)."""
        hosts = {}
        for name, node in live_nodes().items():
            key = (name, node["NodeID"])
            record = self._records.get(key)
            if record is None:
                record = self.store.get(f"host/{name}")
                if record is None:
                    log.warning(
                        "node %s carries host resource %r but no host record; ignoring it",
                        node["NodeID"],
                        name,
                    )
                    continue
                self._records[key] = record
            hosts[name] = Host(
                name,
                node["NodeID"],
                node.get("NodeManagerAddress", ""),
                devices_of(record),
                tuple(sorted((model, entry["path"]) for model, entry in record.get("models", {}).items())),
            )
        for key in [key for key in self._records if key[0] not in hosts or hosts[key[0]].node_id != key[1]]:
            del self._records[key]
        return hosts

    def models(self) -> dict[str, ModelInfo]:
        """Every model a host has registered, as catalog entries (the first host to register a name wins).
        A model stays listed after its hosts leave: a job for it is then refused as on no host now
        (`no_host_for_model`), which says what to do, rather than as an unknown name."""
        models: dict[str, ModelInfo] = {}
        records = self.store.host_records()
        for name in sorted(records):
            for model, entry in records[name].get("models", {}).items():
                if model in models:
                    if models[model].config != entry["config"]:
                        log.warning(
                            "model %r on host %s differs from the one already registered; using the first",
                            model,
                            name,
                        )
                    continue
                models[model] = ModelInfo(model, "local", self._model_files(model, entry), entry["config"])
        return models

    def _model_files(self, model: str, entry: dict[str, Any]) -> Path:
        """A directory on the head with the model's config and tokenizer files (what FileTokenizer reads)."""
        directory = self.model_files_dir / model
        wanted = {"config.json": json.dumps(entry["config"]), **entry.get("files", {})}
        current = {path.name: path.read_text() for path in directory.glob("*")} if directory.is_dir() else {}
        if current != wanted:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            for file_name, text in wanted.items():
                if SAFE_FILE_NAME.match(file_name):
                    (directory / file_name).write_text(text)
        return directory
