"""What the head and each host publish in the cluster's key-value store (Ray's GCS), and the Ray resources
that mark a node as a cortex-nb host and list its models.

    head           {"versions", "address", "started_at"}           written by the backend when it starts
    host/<name>    {"name", "versions", "devices", "models", ...}  written by `cortex-nb host join`

A host record carries each model's config and tokenizer files, so the head can validate requests and
tokenize prompts for a model whose weights exist only on that host. A node is the host <name> while it
carries the resource `cortex-host:<name>`; Ray places a sub-job only on a node with the resource
`cortex-model:<model>`.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from ...devices import Device
from ...models import TINY, ModelInfo

NAMESPACE = b"cortex-nb"
HEAD_KEY = "head"
HOST_PREFIX = "host/"
HOST_RESOURCE_PREFIX = "cortex-host:"
MODEL_RESOURCE_PREFIX = "cortex-model:"
# How much of `cortex-model:<name>` one sub-job asks for: the resource only marks where a model is.
MODEL_RESOURCE_UNITS = 1000.0
MODEL_RESOURCE_PER_SUB_JOB = 0.001
# Files besides config.json the head needs to tokenize a host's model.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
)
MAX_TOKENIZER_FILE_BYTES = 64 * 2**20


def host_resource(name: str) -> str:
    return HOST_RESOURCE_PREFIX + name


def model_resource(name: str) -> str:
    return MODEL_RESOURCE_PREFIX + name


class ClusterStore:
    """JSON records in the GCS key-value store, through Ray's own GCS client (what `ray start` uses), so
    `cortex-nb host join` can read them before this machine is part of the cluster."""

    def __init__(self, gcs_address: str, timeout_s: float = 30.0) -> None:
        from ray._raylet import GcsClient

        self.address = gcs_address
        self.timeout_s = timeout_s
        self._client = GcsClient(address=gcs_address)

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self._client.internal_kv_get(key.encode(), NAMESPACE, timeout=self.timeout_s)
        return json.loads(raw) if raw else None

    def put(self, key: str, record: dict[str, Any]) -> None:
        self._client.internal_kv_put(
            key.encode(), json.dumps(record).encode(), True, NAMESPACE, timeout=self.timeout_s
        )

    def keys(self, prefix: str) -> list[str]:
        return [
            key.decode()
            for key in self._client.internal_kv_keys(prefix.encode(), NAMESPACE, timeout=self.timeout_s)
        ]

    def host_records(self) -> dict[str, dict[str, Any]]:
        records = {}
        for key in self.keys(HOST_PREFIX):
            record = self.get(key)
            if record is not None:
                records[record["name"]] = record
        return records

    def live_host_names(self) -> set[str]:
        """Names of the hosts whose node is up now."""
        names = set()
        for node in self._client.get_all_node_info(timeout=self.timeout_s).values():
            if node.state != 0:  # GcsNodeInfo.ALIVE
                continue
            for resource in node.resources_total:
                if resource.startswith(HOST_RESOURCE_PREFIX):
                    names.add(resource[len(HOST_RESOURCE_PREFIX) :])
        return names


def head_record(versions: dict[str, str], address: str) -> dict[str, Any]:
    return {"versions": versions, "address": address, "started_at": time.time()}


def host_record(
    name: str, versions: dict[str, str], devices: list[Device], models: dict[str, ModelInfo]
) -> dict[str, Any]:
    """What a joining host publishes: its devices (as this host detected them) and its models."""
    return {
        "name": name,
        "hostname": socket.gethostname(),
        "versions": versions,
        "devices": [
            {
                "kind": device.kind,
                "index": device.index,
                "name": device.name,
                "memory_bytes": device.memory_bytes,
                "slots": device.slots,
            }
            for device in devices
        ],
        "models": {model_name: _model_entry(info) for model_name, info in models.items()},
        "joined_at": time.time(),
    }


def _model_entry(info: ModelInfo) -> dict[str, Any]:
    files = {}
    for file_name in TOKENIZER_FILES:
        path = info.path / file_name
        if path.is_file() and path.stat().st_size <= MAX_TOKENIZER_FILE_BYTES:
            files[file_name] = path.read_text()
    return {"path": str(info.path), "config": info.config, "files": files}


def node_resources(name: str, devices: list[Device], models: list[str]) -> dict[str, Any]:
    """`ray start` arguments that make a node the host `name`: its slots as Ray's CPU or GPU resources and
    the cortex-nb resources naming it and its models (the built-in tiny model is on every host)."""
    gpus = [device for device in devices if device.kind == "cuda"]
    cpu_slots = sum(device.slots for device in devices if device.kind == "cpu")
    resources = {host_resource(name): 1.0}
    for model in sorted({TINY, *models}):
        resources[model_resource(model)] = MODEL_RESOURCE_UNITS
    return {"num_cpus": cpu_slots, "num_gpus": len(gpus), "resources": resources}
