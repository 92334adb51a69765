"""Which engine each device samples with (`--sampler`), and how a host without vLLM says so.

This Python (the project's venv) has no vLLM: `auto` must fall back to the built-in engine, and say so
in the start-up log on a GPU device (tests/test_sampler_engine.py checks that `--sampler vllm` is
refused at start). The device list is built by hand because no GPU exists here; the choice only reads a
device's kind.
"""

from __future__ import annotations

import pytest
from cortex_backend.cli import _executor_problem
from cortex_backend.config import BackendSettings
from cortex_backend.devices import Device
from cortex_backend.sampler_choice import assign_samplers, sampler_note, vllm_version

CPU = Device("cpu:0", "cpu", None, "cpu", None, 2)
GPU = Device("cuda:0", "cuda", 0, "NVIDIA H200", 141 << 30, 2)

needs_no_vllm = pytest.mark.skipif(vllm_version() is not None, reason="this Python has vLLM installed")


@needs_no_vllm
def test_auto_without_vllm_samples_with_the_builtin_engine_and_says_why():
    devices = assign_samplers([CPU, GPU], "auto")
    assert [device.sampler for device in devices] == ["transformers", "transformers"]
    assert [device.to_json()["sampler"] for device in devices] == ["transformers", "transformers"]
    note = sampler_note("auto", devices)
    assert "cuda:0: transformers" in note and "vLLM is not installed" in note
    # a CPU-only host falling back is the expected case: nothing to warn about
    assert "not installed" not in sampler_note("auto", assign_samplers([CPU], "auto"))


def test_an_explicit_choice_is_kept_and_a_bad_one_refused():
    assert [d.sampler for d in assign_samplers([CPU, GPU], "transformers")] == ["transformers"] * 2
    with pytest.raises(ValueError, match="--sampler must be one of"):
        assign_samplers([CPU], "sglang")


def test_a_ray_backend_refuses_sampler_vllm_rather_than_ignoring_it(tmp_path):
    """Ray hosts' devices sample with the built-in engine: asking for vLLM there is refused at start."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    problem = _executor_problem(BackendSettings(data_dir=tmp_path, executor="ray", sampler="vllm"))
    assert problem and "--sampler vllm is not available with --executor ray" in problem
    assert _executor_problem(BackendSettings(data_dir=tmp_path, executor="ray", sampler="auto")) is None
