"""Admission by bytes on an adapter host (`--adapter-host-memory`): a slot whose adapter, gradients and
optimizer moments would pass the host's budget is refused with `adapter_host_full` and the bytes, while a
smaller slot still fits beside the others, and a slot that ends makes room again. The budget is set from
in-process peft's own count of the same base and adapters, so the host's measure is checked as well."""

from __future__ import annotations

from cortex_nb import Client

from .backend_process import start_backend
from .reference import reference_base, reference_lora


def held_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def slot_bytes(r: int) -> int:
    """Adapter, gradients and AdamW's two moments: four times the LoRA tensors' bytes."""
    model = reference_lora(reference_base("tiny"), r=r, alpha=2 * r, seed=0)
    return 4 * sum(p.numel() * p.element_size() for name, p in model.named_parameters() if "lora_" in name)


def start(client: Client, r: int, name: str) -> dict:
    """Create a rank-r training job and return its record once it runs or has failed to start."""
    job = client.create_training_job("tiny", lora={"r": r, "alpha": 2 * r}, name=name, wait=False)
    client.wait_for_job(job.job_id, timeout_s=120)
    return client.get_job(job.job_id)


def slot_of(job: dict) -> dict:
    return job["sub_jobs"][0]["info"]


def test_a_slot_past_the_hosts_byte_budget_is_refused_with_the_bytes_and_a_smaller_one_fits(tmp_path):
    base = held_bytes(reference_base("tiny"))
    big, small = slot_bytes(16), slot_bytes(4)
    assert small * 2 < big  # the small slot fits where half a big one would
    budget = base + big + big // 2
    backend = start_backend(
        tmp_path,
        "--adapter-host",
        "--adapter-host-memory",
        str(budget),
        "--devices",
        "cpu:8",
        "--worker-threads",
        "1",
    )
    try:
        with Client(backend.url, backend.token) as client:
            first = start(client, 16, "first")
            assert first["status"] == "running", first
            # The host measures what peft counts in process.
            assert (
                slot_of(first)["slot_bytes"] == big and slot_of(first)["adapter_host"]["base_bytes"] == base
            )

            second = start(client, 16, "second")
            assert second["status"] == "failed" and second["failure_code"] == "adapter_host_full", second
            message = second["failure_message"]
            assert "--adapter-host-memory" in message and f"{budget / 2**20:,.1f} MiB" in message
            assert f"{big / 2**20:,.1f} MiB" in message  # what the slot needed

            # Bytes, not slots: a rank-4 slot fits beside the first.
            third = start(client, 4, "third")
            assert third["status"] == "running" and slot_of(third)["slot_bytes"] == small, third
            assert slot_of(third)["pid"] == slot_of(first)["pid"]  # on the same host
            assert client.get_job(first["job_id"])["status"] == "running"

            # A slot that ends gives its bytes back: a big slot fits again.
            client.cancel_job(first["job_id"])
            client.wait_for_job(first["job_id"], until=("cancelled", "failed", "done"), timeout_s=120)
            fourth = start(client, 16, "fourth")
            assert fourth["status"] == "running" and slot_of(fourth)["slot_bytes"] == big, fourth
    finally:
        backend.stop()


def test_on_a_gpu_without_a_budget_the_devices_free_memory_bounds_what_a_slot_still_allocates():
    from cortex_backend.host_budget import check_slot

    gib = 2**30
    # 40 GiB of 80 free, a 5% reserve: a slot that still needs 30 GiB fits, one that needs 37 GiB does not.
    fits = check_slot(32 * gib, 2 * gib, 16 * gib, 0, 0, None, (40 * gib, 80 * gib))
    refused = check_slot(39 * gib, 2 * gib, 16 * gib, 0, 0, None, (40 * gib, 80 * gib))
    assert fits is None
    assert refused is not None and refused.code == "adapter_host_full"
    assert "37,888.0 MiB" in refused.message and "36,864.0 MiB free" in refused.message
    # Off a GPU and without a budget nothing is checked.
    assert check_slot(10**15, 0, 10**15, 10**15, 3, None, None) is None
