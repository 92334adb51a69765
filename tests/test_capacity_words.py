"""`%cortex capacity`'s lines for adapter hosts and how sub-jobs are hosted: the words the sidebar uses for
the same figures (labextension/test/model.spec.ts asserts the same lines)."""

from __future__ import annotations

from cortex_nb.views import adapter_host_lines, hosting_line


def test_an_adapter_host_is_one_line_of_slots_on_one_base():
    host = {"device": "cpu:0", "base_model": "tiny", "pid": 7, "slots": 3}
    host |= {"base_bytes": 12 * 2**20, "slots_bytes": 640 * 2**10}
    capacity = {"executor": {"name": "local", "hosting": "adapter_host", "adapter_hosts": [host]}}
    assert adapter_host_lines(capacity) == [
        "adapter host cpu:0 · tiny: 3 slot(s) on one base (12.0 MiB held once; slots add 640 KiB)"
    ]
    batching = {**host, "batched_operations": ["forward_backward", "generate"]}
    capacity = {"executor": {"name": "local", "hosting": "adapter_host", "adapter_hosts": [batching]}}
    assert adapter_host_lines(capacity) == [
        "adapter host cpu:0 · tiny: 3 slot(s) on one base (12.0 MiB held once; slots add 640 KiB);"
        " generate and forward_backward batched across slots"
    ]
    # on a device sampling with vLLM, its sampling slots share the host's one vLLM engine
    devices = [
        {"id": "cpu:0", "kind": "cpu", "sampler": "vllm"},
        {"id": "cpu:1", "kind": "cpu", "sampler": "transformers"},
    ]
    other = {**host, "device": "cpu:1"}
    capacity = {"devices": devices, "executor": {"name": "local", "adapter_hosts": [host, other]}}
    assert adapter_host_lines(capacity) == [
        "adapter host cpu:0 · tiny: 3 slot(s) on one base (12.0 MiB held once; slots add 640 KiB);"
        " its vLLM sampling slots share one vLLM engine",
        "adapter host cpu:1 · tiny: 3 slot(s) on one base (12.0 MiB held once; slots add 640 KiB)",
    ]
    assert adapter_host_lines({"executor": {"name": "local", "hosting": "isolation_per_job"}}) == []
    assert adapter_host_lines({}) == []


def test_the_hosting_line_says_how_sub_jobs_run_and_whether_cpu_workers_are_forks():
    forked = {"name": "local", "hosting": "auto", "fork_server": {"pid": 9}, "adapter_hosts": []}
    mixed = [{"id": "cuda:0", "kind": "cuda"}, {"id": "cpu", "kind": "cpu"}]
    assert hosting_line({"executor": forked, "devices": mixed}) == (
        "hosting: adapter hosts on GPUs (slots share a process and its base), a process per sub-job on CPUs;"
        " CPU workers forked from one process"
    )
    # Where only one half of `auto` applies, only that half is said.
    assert hosting_line({"executor": forked, "devices": mixed[1:]}) == (
        "hosting: a process per sub-job; CPU workers forked from one process"
    )
    gpus = {"executor": {"name": "local", "hosting": "auto"}, "devices": mixed[:1]}
    assert hosting_line(gpus) == "hosting: adapter hosts (slots share a process and its base)"
    started = {"name": "local", "hosting": "isolation_per_job"}
    assert hosting_line({"executor": started}) == "hosting: a process per sub-job on every device"
    assert hosting_line({"executor": {"name": "ray"}}) is None  # a backend from before the choice
    ray = {"executor": {"name": "ray", "hosting": "adapter_host"}, "devices": [{"kind": "cpu"}]}
    assert hosting_line(ray) == "hosting: adapter hosts on every device (slots share a process and its base)"
    assert hosting_line({}) is None
