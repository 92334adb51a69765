"""Adapter-host slots are a pool of their own: on a device with an adapter host, sub-jobs that become its
slots (one device, an unquantized base) take adapter slots (`--adapter-slots-per-device`), not the process
slots (`--sub-jobs-per-device`) that sub-jobs with a process of their own take. So a device runs many more
LoRA jobs than it has process slots, a sub-job across devices still gets its processes beside them, and a
job that waits says which pool it waits for.
"""

from __future__ import annotations

import time

import pytest
from cortex_backend.devices import Device
from cortex_backend.executors.base import Hosting
from cortex_backend.scheduler import Scheduler

from cortex_nb import Client
from cortex_nb.api import api_of
from cortex_nb.views import hosts_text

from .backend_process import start_backend

GPU = Device("cuda:0", "cuda", 0, "GPU", 80 * 2**30, 2)
CPU = Device("cpu", "cpu", None, "CPU", 16 * 2**30, 2)


def test_hosting_gives_adapter_slots_to_the_devices_that_host():
    """`auto` hosts on GPUs only, a device sampling with vLLM too (its sampling slots share one engine)."""
    vllm_gpu = Device("cuda:1", "cuda", 1, "GPU", 80 * 2**30, 2, sampler="vllm")
    slots = {d.id: d.adapter_slots for d in Hosting(None).with_adapter_slots([GPU, CPU, vllm_gpu], 16)}
    assert slots == {"cuda:0": 16, "cpu": 0, "cuda:1": 16}
    assert [d.adapter_slots for d in Hosting(True).with_adapter_slots([GPU, CPU], 16)] == [16, 16]
    assert [d.adapter_slots for d in Hosting(False).with_adapter_slots([GPU, CPU], 16)] == [0, 0]


def test_hosted_entries_take_adapter_slots_and_the_others_process_slots():
    [gpu] = Hosting(True).with_adapter_slots([GPU], 3)
    scheduler = Scheduler([gpu])
    for index in range(3):
        scheduler.enqueue(f"lora-{index}", 1, hostable=(True,))
    scheduler.enqueue("two-ranks", 2, hostable=(False, False))  # a sub-job across devices: processes
    admitted = [holder for holder, _ in scheduler.admit()]
    assert admitted == ["lora-0", "lora-1", "lora-2", "two-ranks"]
    assert (scheduler.slots_in_use(gpu), scheduler.adapter_slots_in_use(gpu)) == (2, 3)
    capacity = scheduler.capacity()
    assert (capacity["adapter_slots_total"], capacity["adapter_slots_available"]) == (3, 0)
    assert capacity["devices"][0]["adapter_slots_in_use"] == 3

    scheduler.enqueue("lora-3", 1, hostable=(True,))
    assert scheduler.admit() == []  # the adapter pool is full, whatever the process pool has
    assert scheduler.waits_for_adapter_slots("lora-3", [gpu])
    assert not scheduler.would_fit("lora-3", ["two-ranks"])  # freeing processes does not help it
    assert scheduler.would_fit("lora-3", ["lora-1"])
    scheduler.release("lora-1")
    assert [holder for holder, _ in scheduler.admit()] == ["lora-3"]
    scheduler.release("two-ranks")
    assert (scheduler.slots_in_use(gpu), scheduler.adapter_slots_in_use(gpu)) == (0, 3)


def test_a_device_without_an_adapter_host_counts_every_sub_job_as_a_process():
    [cpu] = Hosting(None).with_adapter_slots([CPU], 8)  # auto: CPUs give each sub-job a process
    scheduler = Scheduler([cpu])
    for index in range(3):
        scheduler.enqueue(f"lora-{index}", 1, hostable=(True,))
    assert [holder for holder, _ in scheduler.admit()] == ["lora-0", "lora-1"]
    assert not scheduler.waits_for_adapter_slots("lora-2", [cpu])
    assert scheduler.would_fit("lora-2", ["lora-0"])


def test_a_whole_gpu_run_waits_for_the_adapter_slots_to_empty_too():
    """A source run taking a GPU whole shares it with nobody, slots of an adapter host included."""
    [gpu] = Hosting(True).with_adapter_slots([GPU], 4)
    scheduler = Scheduler([gpu])
    scheduler.enqueue("lora", 1, hostable=(True,))
    scheduler.admit()
    scheduler.enqueue("run", 1, kind="run", exclusive=True)
    started = []
    scheduler.admission_listeners["run"] = lambda holder, placement: started.append(holder)
    scheduler.admit()
    assert started == [] and scheduler.would_fit("run", ["lora"])
    scheduler.release("lora")
    scheduler.admit()
    assert started == ["run"]


@pytest.fixture(scope="module")
def slots_backend(tmp_path_factory):
    """Two CPU process slots and five adapter-host slots."""
    process = start_backend(
        tmp_path_factory.mktemp("adapter-slots"),
        "--adapter-host",
        "--devices",
        "cpu:2",
        "--adapter-slots-per-device",
        "5",
        "--worker-threads",
        "1",
        "--warm-workers",
        "0",
    )
    yield process
    process.stop()


def wait_status(client: Client, job_id: str, status: str, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get_job(job_id)
        if job["status"] == status:
            return job
        assert time.monotonic() < deadline, f"{job_id} still {job['status']}: {job.get('queue')}"
        time.sleep(0.3)


def lora_job(client: Client, seed: int, **extra) -> str:
    sub = {"type": "training", "base_model": "tiny", "lora": {"r": 4, "alpha": 8}, "seed": seed, **extra}
    return api_of(client).create_job([sub])["job_id"]


def test_a_device_runs_more_lora_jobs_than_process_slots_and_a_waiting_one_names_its_pool(slots_backend):
    with Client(slots_backend.url, slots_backend.token) as client:
        hosted = [lora_job(client, seed) for seed in range(5)]
        for job_id in hosted:
            wait_status(client, job_id, "running")
        infos = [client.get_job(job_id)["sub_jobs"][0]["info"] for job_id in hosted]
        assert len({info["adapter_host"]["pid"] for info in infos}) == 1  # five slots of one process
        capacity = client.get_capacity()
        [device] = capacity["devices"]
        assert (device["slots_in_use"], device["adapter_slots_in_use"], device["adapter_slots"]) == (0, 5, 5)
        assert "2/2 (+0/5 adapter)" in hosts_text(capacity)  # `cortex-nb host list`

        # A sub-job across two CPU slots has processes of its own: it runs beside the five slots.
        ranked = lora_job(client, 9, n_gpus=2)
        wait_status(client, ranked, "running")
        capacity = client.get_capacity()
        assert (capacity["slots_in_use"], capacity["adapter_slots_in_use"]) == (2, 5)

        sixth = lora_job(client, 6)
        queue = wait_status(client, sixth, "pending")["queue"]
        assert "a cpu adapter-host slot: 5/5 held" in queue["reason"], queue
        client.cancel_job(hosted[0])
        wait_status(client, sixth, "running")
        assert (
            client.get_job(sixth)["sub_jobs"][0]["info"]["adapter_host"]["pid"]
            == infos[1]["adapter_host"]["pid"]
        )
        for job_id in [*hosted[1:], ranked, sixth]:
            client.cancel_job(job_id)
