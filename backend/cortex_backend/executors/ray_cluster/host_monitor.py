"""Device samples read on each host: a small actor per host (no device reserved) reads its GPUs through
NVML and its CPU and RAM through psutil, with the same readers the local monitor uses; the head's monitor
thread asks every host each tick and tags each sample with its host.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .hosts import Host

log = logging.getLogger("cortex_backend.executors.ray_cluster")


class HostMonitor:
    """Runs on one host (pinned to its node)."""

    def __init__(self, host: str, devices: list[dict[str, Any]]) -> None:
        from ... import nvml
        from ...monitor import GpuReader, read_host

        self.host = host
        self.devices = devices
        self._read_host = read_host
        self._gpus: dict[str, GpuReader] = {}
        lib = nvml.nvml()
        for device in devices:
            if device["kind"] == "cuda" and lib is not None:
                try:
                    self._gpus[device["id"]] = GpuReader(lib, device["index"])
                except lib.NVMLError as exc:
                    print(f"GPU metrics for {device['id']} are unavailable: {exc}", flush=True)
        read_host()  # psutil's cpu_percent measures since the previous call: prime it

    def sample(self) -> list[dict[str, Any]]:
        host = self._read_host()
        samples = []
        for device in self.devices:
            sample: dict[str, Any] = {"device": device["id"], "host": self.host}
            reader = self._gpus.get(device["id"])
            if reader is not None:
                sample.update(reader.read())
            sample.update(host)
            samples.append(sample)
        return samples


class ClusterSampler:
    """The head's side (a `DeviceSampler`): one monitor actor per host, asked together each tick."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._monitors: dict[str, tuple[str, Any]] = {}  # host -> (node id, actor)
        self._has_gpus = False

    def update(self, hosts: dict[str, Host]) -> None:
        """Start a monitor on each new host; forget those of hosts gone (their actors died with them)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        monitors = {}
        for name, host in hosts.items():
            current = self._monitors.get(name)
            if current is not None and current[0] == host.node_id:
                monitors[name] = current
                continue
            actor = (
                ray.remote(HostMonitor)
                .options(
                    num_cpus=0,
                    max_restarts=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(host.node_id, soft=False),
                )
                .remote(name, [device.to_json() for device in host.devices])
            )
            monitors[name] = (host.node_id, actor)
        for name, (_, actor) in self._monitors.items():
            if name not in monitors:
                ray.kill(actor)
        self._monitors = monitors
        self._has_gpus = any(device.kind == "cuda" for host in hosts.values() for device in host.devices)

    def sample(self) -> list[dict[str, Any]]:
        """One sample per device of every host that answers in time (called on the monitor thread)."""
        import ray

        monitors = list(self._monitors.values())
        if not monitors:
            return []
        refs = [actor.sample.remote() for _, actor in monitors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s)
        at = time.time()
        samples = []
        for ref in ready:
            try:
                samples.extend({"at": at, **sample} for sample in ray.get(ref))
            except Exception as exc:  # a host going away mid-tick: its devices skip this tick
                log.debug("a host monitor did not answer: %s", exc)
        return samples

    def gpu_unavailable_reason(self) -> str | None:
        return (
            None
            if self._has_gpus
            else "the cluster's hosts serve CPU devices only; GPU metrics are not collected"
        )

    def stop(self) -> None:
        import ray

        for _, actor in self._monitors.values():
            ray.kill(actor)
        self._monitors = {}
