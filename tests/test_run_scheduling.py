"""Runs in the shared device scheduler: GPU runs take whole, distinct GPUs; holders of other kinds go
to their listener; a run's environment names exactly its GPUs. GPUs are the one thing faked here."""

from __future__ import annotations

import pytest
from cortex_backend.devices import Device
from cortex_backend.models import ModelCatalog
from cortex_backend.runs.sandbox_config import run_environment
from cortex_backend.runs.spec import validate_run_spec
from cortex_backend.scheduler import Scheduler

from cortex_nb.protocol.errors import ApiError

GIB = 2**30


def gpus(*memory_gib: int, slots: int = 4) -> list[Device]:
    return [Device(f"cuda:{i}", "cuda", i, "GPU", memory * GIB, slots) for i, memory in enumerate(memory_gib)]


def test_gpu_run_takes_whole_distinct_gpus_and_waits_for_idle_ones():
    scheduler = Scheduler(gpus(80, 80, 80))
    started: dict[str, list[Device]] = {}
    scheduler.admission_listeners["run"] = lambda holder, placement: started.update({holder: placement})
    scheduler.enqueue("job-a", 1)
    assert [holder for holder, _ in scheduler.admit()] == ["job-a"]  # jobs still come back from admit()
    scheduler.enqueue("run-2gpu", 2, kind="run", exclusive=True)
    assert scheduler.admit() == []
    placed = started["run-2gpu"]
    assert len(set(placed)) == 2 and all(device.id != "cuda:0" for device in placed)  # cuda:0 is partly used
    capacity = {row["id"]: row for row in scheduler.capacity()["devices"]}
    assert capacity["cuda:1"]["slots_available"] == 0 and capacity["cuda:2"]["slots_available"] == 0

    scheduler.enqueue("run-1gpu", 1, kind="run", exclusive=True)
    scheduler.enqueue("job-b", 1)
    assert scheduler.admit() == []  # the run waits for an idle GPU, and the job waits behind it (FIFO)
    assert "run-1gpu" not in started and scheduler.is_pending("job-b")
    scheduler.release("job-a")
    assert [
        holder for holder, _ in scheduler.admit()
    ] == []  # cuda:0 went whole to the run; job-b still waits
    assert [device.id for device in started["run-1gpu"]] == ["cuda:0"] * 4
    scheduler.release("run-2gpu")
    assert [holder for holder, _ in scheduler.admit()] == ["job-b"]
    assert scheduler.capacity()["slots_in_use"] == 4 + 1


def test_gpu_memory_requirement_filters_devices():
    scheduler = Scheduler(gpus(24, 80))
    assert scheduler.fits_ever(1, 40 * GIB, exclusive=True)
    assert not scheduler.fits_ever(2, 40 * GIB, exclusive=True)
    cpu = Scheduler([Device("cpu", "cpu", None, "CPU", 8 * GIB, 8)])
    assert not cpu.fits_ever(1, exclusive=True)


def test_spec_asking_for_more_gpus_than_the_host_has_is_refused():
    catalog = ModelCatalog({})
    scheduler = Scheduler(gpus(24, 80))
    spec = {"version": 1, "name": "g", "command": "nvidia-smi", "resources": {"gpu": {"count": 2}}}
    assert validate_run_spec(spec, catalog, scheduler)["resources"]["gpu"]["count"] == 2
    for gpu in ({"count": 3}, {"count": 2, "min_vram_gib": 40}):
        with pytest.raises(ApiError) as caught:
            validate_run_spec({**spec, "resources": {"gpu": gpu}}, catalog, scheduler)
        assert (
            caught.value.code == "exceeds_capacity" and caught.value.detail["field"] == "resources.gpu.count"
        )


def test_run_environment_names_its_gpus_and_nothing_secret(monkeypatch):
    monkeypatch.setenv("CORTEX_TOKEN", "ctx_secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/cuda/lib64")
    devices = gpus(80, 80, 80)
    env = run_environment([devices[0], devices[2]])
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert env["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"
    assert "ctx_secret" not in env.values() and "aws-secret" not in env.values()
    assert run_environment([])["CUDA_VISIBLE_DEVICES"] == ""
