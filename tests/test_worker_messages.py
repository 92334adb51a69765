"""Service ↔ worker messages: every kind round-trips through its type, an unknown kind is refused, and the
operations catalog is where the data plane, the worker and the routes take their lists from."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from cortex_backend import data_plane, operations
from cortex_backend import worker_messages as messages
from cortex_backend.devices import Device
from cortex_backend.executors.base import SubJobAssignment, WorkerSettings, init_message
from cortex_backend.models import ModelCatalog
from cortex_backend.slot_logs import tag_line, untag_line
from cortex_backend.worker import Worker

from cortex_nb.protocol import routes, states

EXAMPLES: list[messages.Message] = [
    messages.Hello(pid=123),
    messages.Warm(),
    messages.Ready({"device": "cpu", "trainable_parameters": 10}),
    messages.InitFailed("worker_start_failed", "RuntimeError: no"),
    messages.Started("req-1", 12.5),
    messages.succeeded("req-1", {"loss": 1.5}),
    messages.failed("req-1", "operation_failed", "forward_backward failed"),
    messages.failed("req-1", "cancelled", "cancelled while running"),
    messages.Finished("req-1", states.REQUEST_CANCELLED),
    messages.Loop("req-2", {"event": "step", "step": 3, "loss": 0.5}),
    messages.Tokens(
        "req-2", [{"prompt_index": 0, "sample_index": 0, "tokens": [5], "logprobs": [-0.1], "text": "a"}]
    ),
    messages.Sync("sync-1", "sub-2", "delta", {"names": ["a"], "blob_bytes": 12}),
    messages.Init(
        "job-1", "sub-1", "training", {"seed": 1}, {"name": "tiny"}, {}, None, [], "transformers", {}
    ),
    messages.Request("req-3", "step", {"learning_rate": 0.1}),
    messages.Cancel("req-3"),
    messages.Drain(),
    messages.Shutdown(),
    messages.HostAdapters({"CUDA_VISIBLE_DEVICES": "0"}, 2),
    messages.Released(),
    messages.Log("stdout", [[1.0, "a line"]]),
    messages.WorkerExited("it stopped"),
]


def test_every_message_kind_round_trips_through_its_type():
    assert {type(message) for message in EXAMPLES} == set(messages.KINDS.values())
    for message in EXAMPLES:
        header = messages.encode(message)
        assert header["type"] == message.kind
        assert messages.decode(header) == message
        # addressed to an adapter host's slot, the same message with the slot beside it
        addressed = messages.encode(message, slot="sub-9")
        assert messages.slot_of(addressed) == "sub-9"
        assert messages.decode(addressed) == message


def test_the_init_message_is_built_once_for_every_executor():
    catalog = ModelCatalog({})
    device = Device(
        id="cpu:0", kind="cpu", index=0, name="cpu", memory_bytes=0, slots=1, sampler="transformers"
    )
    assignment = SubJobAssignment(
        "job-1", "sub-1", "training", {"base_model": "tiny"}, catalog.get("tiny"), device
    )
    init = init_message(assignment, WorkerSettings(threads=2, faults=("nan_loss",)))
    header = messages.encode(init)
    assert header["type"] == "init" and header["model"]["name"] == "tiny"
    assert header["threads"] == 2 and header["faults"] == ["nan_loss"] and header["sampler"] == "transformers"
    assert messages.decode(header) == init
    # Both executors build it with this function and no other literal init.
    from cortex_backend.executors import local
    from cortex_backend.executors.ray_cluster import executor as ray_executor

    for module in (local, ray_executor):
        source = inspect.getsource(module)
        assert "init_message(" in source and '"type": "init"' not in source


@pytest.mark.parametrize(
    "header",
    [
        {"type": "launch_missiles"},
        {"no_type": 1},
        {"type": 7},
        {"type": "started"},
        {"type": "cancel", "x": 1},
    ],
)
def test_a_header_that_is_no_message_is_refused(header):
    with pytest.raises(messages.UnknownMessage):
        messages.decode(header)


def test_a_finished_request_reports_a_request_state():
    with pytest.raises(messages.UnknownMessage):
        messages.Finished("req-1", "done")


def test_the_operations_catalog_drives_targets_dispatch_and_payload_checks():
    catalog = operations.CATALOG
    # The worker serves each operation with the method of its name, and no other.
    assert set(Worker(channel=None).operations) == set(catalog)  # type: ignore[arg-type]
    # Every operation a client may send has a route and default targets that serve it; what a sub-job type
    # serves when named is its targets read the other way (one list, not two).
    for name, targets in operations.DEFAULT_TARGETS.items():
        assert routes.route(name) is not None
        assert all(name in operations.SERVED_BY_TYPE[target] for target in targets)
    assert operations.SERVED_BY_TYPE[states.LOG_PROBABILITY] == {"noop", "forward", "load"}
    assert "step" not in operations.SERVED_BY_TYPE[states.SAMPLING]
    # The data plane checks payloads per operation; every preparer is of a catalog operation.
    manager = data_plane.RequestManager.__new__(data_plane.RequestManager)
    preparers = {
        name[len("_prepare_") :] for name, _ in inspect.getmembers(manager) if name.startswith("_prepare_")
    }
    assert preparers <= set(catalog)
    assert operations.FRAME_OPERATIONS == {"forward_backward", "forward"}
    assert [name for name, op in catalog.items() if op.reads_merged_weights] == ["forward"]
    assert all(dataclasses.is_dataclass(op) for op in catalog.values())


def test_slot_log_lines_say_their_slot():
    assert untag_line(tag_line("sub-1", "[engine] step=1")) == ("sub-1", "[engine] step=1")
    assert untag_line("a host line") == (None, "a host line")


def test_the_worker_and_executor_modules_import_in_one_direction():
    """executors.base (the interface) <- executors.local, the ray executor <- executors.choice; worker <- adapter_host
    <- worker_process: no circle through any of them (every import counts, lazy ones too)."""
    from .import_graph import cycles, graph

    ours = {
        "cortex_backend.executors.base",
        "cortex_backend.executors.choice",
        "cortex_backend.executors.local",
        "cortex_backend.executors.ray_cluster.executor",
        "cortex_backend.worker",
        "cortex_backend.worker_process",
        "cortex_backend.adapter_host",
        "cortex_backend.worker_messages",
        "cortex_backend.operations",
        "cortex_backend.data_plane",
    }
    assert [cycle for cycle in cycles(graph(), "cortex_backend") if ours & set(cycle)] == []
