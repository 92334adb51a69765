"""The backend's rooms: it reads `cortex_nb.protocol` and nothing else of the SDK, and its modules import
one another without a circle. Read from the source (tests/import_graph.py): no backend is started."""

from __future__ import annotations

import pytest

from .import_graph import cycles, graph


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return graph()


def _in_protocol(module: str) -> bool:
    return module == "cortex_nb.protocol" or module.startswith("cortex_nb.protocol.")


def test_the_backend_imports_only_the_protocol_of_cortex_nb(edges):
    outside = {
        (module, target)
        for module, targets in edges.items()
        if module.startswith("cortex_backend")
        for target in targets
        if (target == "cortex_nb" or target.startswith("cortex_nb.")) and not _in_protocol(target)
    }
    assert outside == set()


def test_the_rule_sees_a_backend_import_of_the_sdk(edges):
    # The graph resolves `from cortex_nb.protocol import states` to a protocol module, and an SDK module as one.
    assert "cortex_nb.protocol.states" in edges["cortex_backend.training_loops"]
    assert "cortex_nb.protocol.model_names" in edges["cortex_backend.executors.ray_cluster.join"]
    assert "cortex_nb.batching" in edges["cortex_nb.client"]


def test_no_import_cycle_among_cortex_backend_modules(edges):
    # Every import counts, lazy ones and TYPE_CHECKING ones too.
    assert cycles(edges, "cortex_backend") == []


def test_the_engines_import_the_sampling_interface_and_only_the_factory_imports_the_engines(edges):
    interface = "cortex_backend.engine.sampling_interface"
    engines = {"cortex_backend.engine.transformers_sampler", "cortex_backend.engine.vllm_sampler"}
    assert all(interface in edges[engine] for engine in engines)
    assert not engines & edges[interface]
    assert engines <= edges["cortex_backend.engine.sampling_engine"]
