"""`%cortex capacity`'s lines for adapter hosts: the words the sidebar uses for the same figures
(labextension/test/model.spec.ts asserts the same line)."""

from __future__ import annotations

from cortex_nb.views import adapter_host_lines


def test_an_adapter_host_is_one_line_of_slots_on_one_base():
    host = {"device": "cpu:0", "base_model": "tiny", "pid": 7, "slots": 3}
    host |= {"base_bytes": 12 * 2**20, "slots_bytes": 640 * 2**10}
    capacity = {"executor": {"name": "local", "hosting": "adapter_host", "adapter_hosts": [host]}}
    assert adapter_host_lines(capacity) == [
        "adapter host cpu:0 · tiny: 3 slot(s) on one base (12.0 MiB held once; slots add 640 KiB)"
    ]
    assert adapter_host_lines({"executor": {"name": "local", "hosting": "isolation_per_job"}}) == []
    assert adapter_host_lines({}) == []
