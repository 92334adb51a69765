"""Placement on a cluster's hosts (the scheduler with devices that serve some models and come and go), the
version rule `cortex-nb host join` applies, and Ray staying optional. Fast, no cluster: the real cluster is
in test_ray_executor.py."""

from __future__ import annotations

import subprocess
import sys

from cortex_backend.devices import Device
from cortex_backend.executors.base import SubJobAssignment
from cortex_backend.executors.ray_cluster.executor import RayExecutor
from cortex_backend.executors.ray_cluster.hosts import devices_of
from cortex_backend.executors.ray_cluster.versions import mismatches
from cortex_backend.scheduler import Scheduler

TINY = frozenset({"tiny"})
BOTH = frozenset({"tiny", "llama"})


def cpu(host: str, models: frozenset[str], slots: int = 1) -> Device:
    return Device(f"{host}/cpu", "cpu", None, "CPU", 8 * 2**30, slots, host, models)


def test_a_job_is_placed_only_where_its_model_is():
    scheduler = Scheduler([cpu("a", TINY), cpu("b", BOTH)])
    scheduler.enqueue("needs-llama", 1, models=frozenset({"llama"}))
    scheduler.enqueue("needs-tiny", 1, models=TINY)
    admitted = dict(scheduler.admit())
    assert [device.host for device in admitted["needs-llama"]] == ["b"]
    assert [device.host for device in admitted["needs-tiny"]] == ["a"]
    assert not scheduler.fits_ever(1, models=frozenset({"mistral"}))
    assert scheduler.models_served() == BOTH


def test_a_job_spans_hosts_when_no_one_host_holds_it():
    scheduler = Scheduler([cpu("a", TINY), cpu("b", TINY)])
    scheduler.enqueue("pair", 2, models=TINY)
    assert sorted(device.host for device in dict(scheduler.admit())["pair"]) == ["a", "b"]


def test_ranks_placed_across_hosts_are_refused_on_ray_and_ranks_on_one_host_start():
    """A rank group's actors share one node (a placement group): ranks the scheduler had to spread over
    hosts fail `exceeds_capacity` at once instead of waiting on Ray."""
    from cortex_backend.models import ModelInfo

    model = ModelInfo("tiny", "builtin", None, {})
    scheduler = Scheduler([cpu("a", TINY), cpu("b", TINY), cpu("c", TINY, slots=2)])
    scheduler.enqueue("fits-c", 2, models=TINY)
    scheduler.enqueue("spread", 2, models=TINY)
    admitted = dict(scheduler.admit())
    for holder, expected in (("fits-c", None), ("spread", "exceeds_capacity")):
        devices = tuple(admitted[holder])
        assignment = SubJobAssignment(holder, "training-0", "training", {}, model, devices[0], devices)
        refusal = RayExecutor._rank_group_refusal(assignment)
        assert (refusal[0] if refusal else None) == expected, holder
    assert "placed on hosts a, b" in RayExecutor._rank_group_refusal(assignment)[1]


def test_a_host_leaving_keeps_its_holders_counted_until_released_and_fails_what_can_never_fit():
    scheduler = Scheduler([cpu("a", TINY), cpu("b", BOTH)])
    scheduler.enqueue("on-b", 1, models=frozenset({"llama"}))
    assert dict(scheduler.admit())["on-b"][0].host == "b"
    scheduler.enqueue("llama-later", 1, models=frozenset({"llama"}))
    scheduler.enqueue("tiny-later", 2, models=TINY)
    assert scheduler.admit() == []  # b is full, and FIFO holds tiny-later behind llama-later
    scheduler.set_devices([cpu("a", TINY)])
    assert scheduler.pending_that_never_fit() == ["llama-later", "tiny-later"]  # no llama; one slot left
    capacity = scheduler.capacity()
    assert [host["host"] for host in capacity["hosts"]] == ["a"] and capacity["slots_available"] == 1
    assert scheduler.release("on-b")  # its sub-jobs failed (host_lost): the departed device is forgotten
    assert scheduler.capacity()["slots_in_use"] == 0


def test_capacity_is_summed_over_hosts_and_given_per_host():
    scheduler = Scheduler([cpu("a", TINY, slots=2), cpu("b", BOTH, slots=3)])
    scheduler.enqueue("j", 2, models=TINY)
    scheduler.admit()
    capacity = scheduler.capacity()
    assert capacity["slots_total"] == 5 and capacity["slots_in_use"] == 2
    hosts = {host["host"]: host for host in capacity["hosts"]}
    assert hosts["b"] == {
        "host": "b",
        "devices": ["b/cpu"],
        "slots_total": 3,
        "slots_in_use": 2,
        "slots_available": 1,
        "adapter_slots_total": 0,
        "adapter_slots_available": 0,
        "models": ["llama", "tiny"],
    }
    assert hosts["a"]["slots_available"] == 2


def test_a_host_records_devices_get_host_prefixed_ids_and_its_models():
    record = {
        "name": "gpu-box",
        "models": {"llama": {"path": "/m/llama", "config": {}}},
        "devices": [{"kind": "cuda", "index": 1, "name": "H100", "memory_bytes": 80 * 2**30, "slots": 1}],
    }
    (device,) = devices_of(record)
    assert (device.id, device.host, device.index, device.models) == ("gpu-box/cuda:1", "gpu-box", 1, BOTH)


def test_versions_must_match_where_they_matter():
    head = {"python": "3.11.7", "torch": "2.13.0+cpu", "cortex-nb": "0.1.0", "ray": "2.60.0"}
    assert (
        mismatches(head, {**head, "python": "3.11.9", "torch": "2.13.0+cu128"}) == []
    )  # patch level, CUDA build
    assert mismatches(head, {**head, "python": "3.12.1", "ray": "2.59.0"}) == [
        "python: head 3.11.7, this host 3.12.1",
        "ray: head 2.60.0, this host 2.59.0",
    ]
    assert mismatches(head, {**head, "torch": "2.12.1", "cortex-nb": "0.2.0"}) == [
        "torch: head 2.13.0+cpu, this host 2.12.1",
        "cortex-nb: head 0.1.0, this host 0.2.0",
    ]


def test_ray_is_imported_only_when_the_ray_executor_is_chosen():
    code = (
        "import sys, cortex_backend.service, cortex_backend.cli, cortex_nb.cli; print('ray' in sys.modules)"
    )
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )


def test_a_backend_with_no_devices_needs_the_ray_executor(tmp_path):
    refused = subprocess.run(
        [sys.executable, "-m", "cortex_backend", "serve", "--devices", "none", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "--devices none needs --executor ray" in refused.stderr
