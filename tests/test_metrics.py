"""Device metrics: the monitor's samples on this host, their persistence per job, the readers
(REST, gpu.jsonl, pandas), and NVML's failure modes run for real in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from cortex_nb import Client, NotFoundError
from cortex_nb.protocol.states import JOB_DONE

from .backend_process import start_backend
from .tokens import create_token

HOST_FIELDS = {"cpu_percent", "ram_used_bytes", "ram_total_bytes"}
GPU_FIELDS = {
    "gpu_utilization_percent",
    "gpu_memory_used_bytes",
    "gpu_memory_total_bytes",
    "gpu_temperature_c",
    "gpu_power_watts",
}
BATCH = {"input_ids": [[1, 2, 3]], "target_tokens": [[2, 3, 4]], "weights": [[1.0, 1.0, 1.0]]}


def nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def assert_host_sample(sample: dict) -> None:
    assert HOST_FIELDS <= set(sample)
    assert 0.0 <= sample["cpu_percent"] <= 100.0
    assert 0 < sample["ram_used_bytes"] <= sample["ram_total_bytes"]
    assert abs(sample["at"] - time.time()) < 3600


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    """A backend sampling every 0.2 s (so a short job has many samples)."""
    backend = start_backend(
        tmp_path_factory.mktemp("metered"),
        "--devices",
        "cpu:2",
        "--worker-threads",
        "1",
        "--monitor-interval",
        "0.2",
    )
    yield backend
    backend.stop()


@pytest.fixture(scope="module")
def finished_job(metered):
    with Client(metered.url, metered.token) as client:
        job = client.create_training_job("tiny", lora={"r": 2})
        for _ in range(3):
            job.forward_backward(BATCH).result()
            job.step().result()
        time.sleep(1.0)
        job.complete()
        info = client.wait_for_job(job.job_id, until=(JOB_DONE,))
        return info


def test_host_samples_on_this_host_carry_cpu_and_ram_and_no_gpu_fields(client):
    deadline = time.monotonic() + 10
    while not (host := client.host_metrics())["samples"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [sample["device"] for sample in host["samples"]] == ["cpu"]
    sample = host["samples"][0]
    assert_host_sample(sample)
    assert set(sample) == {"at", "device", *HOST_FIELDS}  # GPU fields absent, not zero or null
    assert isinstance(host["gpu_unavailable_reason"], str) and host["gpu_unavailable_reason"]
    # What views show: one quiet line, not the NVML error (that stays in gpu_unavailable_reason).
    assert host["gpu_metrics_note"] == "CPU host: no GPU metrics"
    assert host["interval_s"] == 1.0
    assert client.host_metrics(since=sample["at"])["samples"] == []


def test_job_metrics_are_persisted_within_the_job_lifetime_and_readable_after_it_ends(metered, finished_job):
    with Client(metered.url, metered.token) as client:
        page = client.get_job_metrics(finished_job["job_id"])
        samples = page["samples"]
        assert len(samples) >= 5
        assert page["devices"] == ["cpu"]
        for sample in samples:
            assert sample["device"] == "cpu"
            assert finished_job["started_at"] <= sample["at"] <= finished_job["finished_at"]
            assert not any(key.startswith("gpu_") for key in sample)
            assert_host_sample(sample)
        assert [s["at"] for s in samples] == sorted(s["at"] for s in samples)
        # Attributed to the job's own sub-job while it held the device.
        assert any(sample["sub_job_ids"] == ["training-0"] for sample in samples)
        # The host's figures, and next to them the job's own worker process, once it was read twice.
        own = [sample for sample in samples if "job_cpu_percent" in sample]
        assert own and len(own) < len(samples)  # absent (never 0) before the worker could be measured
        assert all(set(sample) >= {"job_cpu_percent", "job_ram_bytes"} for sample in own)
        assert all(0.0 <= sample["job_cpu_percent"] <= 100.0 for sample in own)
        # A worker with torch loaded holds far more than a few MB, and less than the host uses in all.
        assert all(0 < sample["job_ram_bytes"] <= sample["ram_used_bytes"] for sample in own)
        assert max(sample["job_ram_bytes"] for sample in own) > 64 << 20
        assert max(sample["job_cpu_percent"] for sample in own) > 0.0  # it trained while sampled
        assert not any("workers" in sample or "sub_jobs" in sample for sample in samples)
        assert page["gpu_metrics_note"] == "CPU host: no GPU metrics"
        assert page["next_since"] == samples[-1]["at"]
        time.sleep(0.6)  # the monitor keeps sampling; the ended job's window does not grow
        assert client.get_job_metrics(finished_job["job_id"])["samples"] == samples
        assert client.get_job_metrics(finished_job["job_id"], since=page["next_since"])["samples"] == []


def test_paging_by_next_since_loses_and_repeats_nothing(metered, finished_job):
    with Client(metered.url, metered.token) as client:
        everything = client.get_job_metrics(finished_job["job_id"], limit=10_000)["samples"]
        paged, since = [], 0.0
        while True:
            page = client.get_job_metrics(finished_job["job_id"], since=since, limit=2)
            if not page["samples"]:
                break
            paged.extend(page["samples"])
            since = page["next_since"]
        assert paged == everything


def test_downloads_and_dataframe_match_the_endpoint(metered, finished_job, tmp_path):
    with Client(metered.url, metered.token) as client:
        samples = client.get_job_metrics(finished_job["job_id"], limit=10_000)["samples"]
        path = client.download_metrics(finished_job["job_id"], tmp_path)
        assert path == tmp_path / "gpu.jsonl"
        assert [json.loads(line) for line in path.read_text().splitlines()] == samples
        frame = client.metrics_df(finished_job["job_id"])
        assert list(frame.columns) == [
            "at",
            "device",
            "cpu_percent",
            "ram_used_bytes",
            "ram_total_bytes",
            "job_cpu_percent",
            "job_ram_bytes",
            "sub_job_ids",
        ]
        assert len(frame) == len(samples)
        assert frame["ram_used_bytes"].tolist() == [sample["ram_used_bytes"] for sample in samples]


def test_metrics_of_another_owner_are_not_found_and_bad_arguments_are_refused(metered, finished_job):
    with Client(metered.url, create_token(metered.data_dir, "eve", "jobs:read", "jobs:write")) as other:
        with pytest.raises(NotFoundError):
            other.get_job_metrics(finished_job["job_id"])
    response = httpx.get(
        f"{metered.url}/v1/jobs/{finished_job['job_id']}/metrics",
        params={"since": "yesterday"},
        headers={"Authorization": f"Bearer {metered.token}"},
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_field"


def test_a_job_waiting_for_a_device_has_no_samples(metered):
    with Client(metered.url, metered.token) as client:
        both_slots = [{"type": "training", "base_model": "tiny"}, {"type": "sampling", "base_model": "tiny"}]
        first = client.create_job(both_slots)
        waiting = client.create_job(both_slots)
        assert client.get_job(waiting["job_id"])["status"] == "pending"
        time.sleep(0.5)
        page = client.get_job_metrics(waiting["job_id"])
        assert page["samples"] == [] and page["next_since"] == 0.0 and page["devices"] == []
        client.cancel_job(waiting["job_id"])
        client.cancel_job(first["job_id"])


# NVML: the single init and its failure modes, each in a fresh process ----------------------------------
MONITOR_PROBE = textwrap.dedent("""
    import json
    from cortex_backend import nvml
    from cortex_backend.devices import detect_devices
    from cortex_backend.monitor import Monitor
    devices = detect_devices("auto", 1)
    monitor = Monitor(None, devices, 1.0)
    print(json.dumps({"devices": [d.id for d in devices], "reason": monitor.gpu_unavailable_reason,
                      "nvml_reason": nvml.unavailable_reason(), "samples": monitor.sample()}))
""")


def run_probe(env_extra: dict[str, str]) -> dict:
    env = {**os.environ, **env_extra}
    done = subprocess.run(
        [sys.executable, "-c", MONITOR_PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_the_pynvml_library_samples_carry_host_fields_only(tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    # Whatever else is installed, `import pynvml` fails in this process, as on a host without nvidia-ml-py.
    (shadow / "pynvml.py").write_text("raise ImportError(\"No module named 'pynvml'\")\n")
    probe = run_probe({"PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])})
    assert probe["devices"] == ["cpu"]
    assert "pynvml is not installed" in probe["nvml_reason"] and probe["reason"] == probe["nvml_reason"]
    [sample] = probe["samples"]
    assert set(sample) == {"at", "device", *HOST_FIELDS}
    assert_host_sample(sample)


def test_when_nvml_cannot_load_its_library_samples_carry_host_fields_only(tmp_path):
    broken = tmp_path / "lib"
    broken.mkdir()
    # A file where the driver's library should be: found first, fails to load, as with a broken driver install.
    (broken / "libnvidia-ml.so.1").write_bytes(b"not a shared library\n")
    probe = run_probe(
        {"LD_LIBRARY_PATH": os.pathsep.join([str(broken), os.environ.get("LD_LIBRARY_PATH", "")])}
    )
    assert probe["devices"] == ["cpu"]
    assert (
        probe["nvml_reason"].startswith("NVML could not start:")
        and "Library Not Found" in probe["nvml_reason"]
    )
    [sample] = probe["samples"]
    assert set(sample) == {"at", "device", *HOST_FIELDS}


def test_asking_for_gpus_without_nvml_fails_at_start_with_the_reason(tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "pynvml.py").write_text("raise ImportError(\"No module named 'pynvml'\")\n")
    env = {**os.environ, "PYTHONPATH": str(shadow)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cortex_backend",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
            "--devices",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "pynvml is not installed" in done.stderr


def test_the_monitor_reports_what_this_host_has():
    """On a GPU host: every GPU field, read from the real NVML. Elsewhere: host fields only, and why."""
    if not nvml_works():
        probe = run_probe({})
        assert probe["devices"] == ["cpu"] and probe["reason"]
        [sample] = probe["samples"]
        assert set(sample) == {"at", "device", *HOST_FIELDS}  # absent, never zero
        assert_host_sample(sample)
        return
    import pynvml

    pynvml.nvmlInit()
    expected_total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    probe = run_probe({"CUDA_VISIBLE_DEVICES": "0"})
    assert probe["devices"] == ["cuda:0"] and probe["reason"] is None
    [sample] = probe["samples"]
    assert sample["device"] == "cuda:0"
    assert {"gpu_utilization_percent", "gpu_memory_used_bytes", "gpu_memory_total_bytes"} <= set(sample)
    assert sample["gpu_memory_total_bytes"] == expected_total
    assert 0 <= sample["gpu_utilization_percent"] <= 100
    assert 0 < sample["gpu_memory_used_bytes"] <= sample["gpu_memory_total_bytes"]
    assert set(sample) - {"at", "device"} <= GPU_FIELDS | HOST_FIELDS
    assert_host_sample(sample)
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    assert run_probe({"CUDA_VISIBLE_DEVICES": uuid})["devices"] == ["cuda:0"]


def test_cuda_visible_devices_names_nvml_indices_or_uuids_and_stops_at_the_first_unknown():
    from cortex_backend.devices import visible_nvml_indices

    uuids = {"GPU-aaaa": 2, "GPU-bbbb": 0}
    assert visible_nvml_indices(None, 4, uuids.get) == [0, 1, 2, 3]
    assert visible_nvml_indices("", 4, uuids.get) == []
    assert visible_nvml_indices("3,1", 4, uuids.get) == [3, 1]
    assert visible_nvml_indices("GPU-aaaa, 1", 4, uuids.get) == [2, 1]
    assert visible_nvml_indices("1,7,2", 4, uuids.get) == [1]  # 7 does not exist: CUDA ignores the rest
    assert visible_nvml_indices("GPU-zzzz,0", 4, uuids.get) == []
    assert visible_nvml_indices("-1", 4, uuids.get) == []


def test_monitor_ticks_persist_attribute_and_trim(tmp_path):
    from cortex_backend.devices import detect_devices
    from cortex_backend.monitor import Monitor
    from cortex_backend.store import Store

    store = Store(tmp_path / "cortex.sqlite3")
    store.insert_job(
        {"id": "job-a", "owner": "ann", "status": "running", "spec": {}},
        [{"id": "training-0", "type": "training", "status": "running", "spec": {}}],
    )
    store.update_sub_job("job-a", "training-0", device="cpu")
    store.insert_run(
        {
            "id": "run-b",
            "owner": "bo",
            "submission_id": "s1",
            "name": "b",
            "status": "running",
            "spec": {},
            "manifest": {},
        }
    )
    store.update_run("run-b", devices=["cpu"])
    # The "worker" of job-a is a real process that works a little; run-b's process is not known.
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile True: sum(range(100_000)); time.sleep(0.005)"]
    )
    pids = {("job-a", "training-0"): worker.pid}
    monitor = Monitor(
        store,
        detect_devices("cpu", 2),
        interval_s=0.05,
        retention_s=3600,
        worker_pid=lambda job_id, sub_job_id: pids.get((job_id, sub_job_id)),
    )
    monitor.start()
    deadline = time.monotonic() + 10
    while monitor.samples_taken < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    monitor.stop()
    worker.kill()
    worker.wait()
    stored = store.device_samples(["cpu"], 0.0, None, 100)
    assert len(stored) == monitor.samples_taken >= 8
    assert all(sample["sub_jobs"] == ["job-a/training-0", "run-b/main"] for sample in stored)
    # The first tick only primes the worker's CPU span: no reading, rather than a made-up 0.
    assert "workers" not in stored[0]
    readings = [sample["workers"] for sample in stored[1:]]
    assert all(set(reading) == {"job-a/training-0"} for reading in readings)  # run-b: absent, not zero
    assert all(
        0 < reading["job-a/training-0"]["ram_bytes"] < stored[0]["ram_used_bytes"] for reading in readings
    )
    assert max(reading["job-a/training-0"]["cpu_percent"] for reading in readings) > 0
    assert monitor.latest()[0] == stored[-1]
    assert monitor.errors == 0
    assert store.trim_device_samples(stored[2]["at"]) == 2
    assert store.device_samples(["cpu"], 0.0, None, 100) == stored[2:]
    store.close()


def test_the_backend_cli_takes_the_monitor_interval_and_log_retention(tmp_path):
    backend = start_backend(
        Path(tmp_path),
        "--devices",
        "cpu:1",
        "--warm-workers",
        "0",
        "--monitor-interval",
        "0",
        "--log-retention-lines",
        "10",
    )
    try:
        with Client(backend.url, backend.token) as client:
            time.sleep(0.5)
            host = client.host_metrics()
            assert host["interval_s"] == 0 and host["samples"] == []  # sampling off
    finally:
        backend.stop()
    done = subprocess.run(
        [sys.executable, "-m", "cortex_backend", "serve", "--log-retention-lines", "0"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "must be at least 1" in done.stderr
