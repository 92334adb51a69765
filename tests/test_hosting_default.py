"""Where sub-jobs share an adapter host by default: on GPUs (where processes time-share the device and each
would hold its own copy of the base in device memory), not on CPUs (where processes compute side by side);
the operator's `--adapter-host` or `--isolation-per-job` decides for every device."""

from __future__ import annotations

from pathlib import Path

from cortex_backend.devices import Device
from cortex_backend.executors.local import LocalExecutor

from cortex_nb import Client

from .backend_process import start_backend

GPU = Device(id="cuda:0", kind="cuda", index=0, name="H200", memory_bytes=141 * 2**30, slots=4)
CPU = Device(id="cpu:0", kind="cpu", index=None, name="cpu", memory_bytes=None, slots=4)


def test_by_default_gpus_host_adapters_and_cpus_run_a_process_per_sub_job():
    default = LocalExecutor(None, [GPU, CPU])
    assert default.hosts_on(GPU) and not default.hosts_on(CPU)
    assert default.describe()["hosting"] == "auto"
    for choice, name in ((True, "adapter_host"), (False, "isolation_per_job")):
        chosen = LocalExecutor(None, [GPU, CPU], adapter_host=choice)
        assert chosen.hosts_on(GPU) is choice and chosen.hosts_on(CPU) is choice
        assert chosen.describe()["hosting"] == name


def test_a_default_cpu_backend_gives_each_sub_job_its_own_process(tmp_path: Path):
    backend = start_backend(tmp_path / "default", "--devices", "cpu:2", "--worker-threads", "1")
    client = Client(backend.url, backend.token)
    try:
        executor = client.get_capacity()["executor"]
        assert executor["hosting"] == "auto" and executor["adapter_hosts"] == []
        jobs = [client.create_training_job("tiny"), client.create_training_job("tiny")]
        try:
            pids = {job.info["sub_jobs"][0]["info"]["pid"] for job in jobs}
            assert len(pids) == 2
            assert not any("adapter_host" in job.info["sub_jobs"][0]["info"] for job in jobs)
            assert client.get_capacity()["executor"]["adapter_hosts"] == []
        finally:
            for job in jobs:
                job.cancel()
    finally:
        backend.stop()
