"""Shared fixtures: a small registered model, a real backend on loopback, clients."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cortex_nb import Client

from .backend_process import BackendProcess, start_backend
from .model_factory import build_char_llama_dir, build_gpt2_dir

os.environ.setdefault("CORTEX_DISABLE_TELEMETRY", "1")
# Backends started by tests refuse to render a reply field their schema does not declare (config.py).
os.environ.setdefault("CORTEX_STRICT_REPLIES", "1")
# CORTEX_TEST_ADAPTER_HOST=1 runs the session backend's sub-jobs as adapter-host slots
# (docs/api.md), so the suites that use it check that mode against the same expectations.
HOSTING_ARGS = ("--adapter-host",) if os.environ.get("CORTEX_TEST_ADAPTER_HOST") == "1" else ()


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory) -> Path:
    return build_gpt2_dir(tmp_path_factory.mktemp("models") / "small-gpt2")


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    return build_char_llama_dir(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def backend(tmp_path_factory, gpt2_dir, llama_dir) -> BackendProcess:
    """One backend for the session, 8 CPU slots: `tiny`, the registered `small-gpt2`, and a small Llama with a
    Hugging Face tokenizer registered under a Hugging Face style name (`cortex-test/tiny-llama`)."""
    process = start_backend(
        tmp_path_factory.mktemp("backend"),
        "--model",
        f"small-gpt2={gpt2_dir}",
        "--model",
        f"cortex-test/tiny-llama={llama_dir}",
        "--devices",
        "cpu:8",
        "--worker-threads",
        "1",
        *HOSTING_ARGS,
    )
    yield process
    process.stop()


@pytest.fixture
def client(backend) -> Client:
    with Client(backend.url, backend.token) as client:
        yield client


@pytest.fixture(scope="session")
def tls_backend(tmp_path_factory) -> BackendProcess:
    """A backend serving HTTPS with the certificate `--tls self-signed` makes: `tiny`, 4 CPU slots.
    Its `fingerprint` is what clients pin (tests/test_tls.py, the Cortex SDK tests, the proxy test)."""
    process = start_backend(
        tmp_path_factory.mktemp("tls-backend"),
        "--tls",
        "self-signed",
        "--devices",
        "cpu:4",
        "--worker-threads",
        "1",
        "--warm-workers",
        "2",
    )
    yield process
    process.stop()


# source runs -----------------------------------------------------------------------------------
# Planted in the runs backend's environment: a run must never see them (tests/test_runs_sandbox.py).
RUNS_BACKEND_SECRETS = {
    "CORTEX_TOKEN": "ctx_planted-secret-token",
    "HF_TOKEN": "hf_planted-secret",
    "RUNS_TEST_CANARY": "canary-4711",
}


@pytest.fixture(scope="session")
def runs_backend(tmp_path_factory, gpt2_dir) -> BackendProcess:
    """A backend for source runs: 4 CPU slots, a 1 GiB address-space limit (so a memory hog fails
    fast), a 1 s kill grace, and planted secrets in its environment."""
    process = start_backend(
        tmp_path_factory.mktemp("runs-backend"),
        "--model",
        f"small-gpt2={gpt2_dir}",
        "--devices",
        "cpu:4",
        "--warm-workers",
        "0",
        "--run-address-space-mib",
        "1024",
        "--run-kill-grace",
        "1",
        env=RUNS_BACKEND_SECRETS,
    )
    yield process
    process.stop()


@pytest.fixture
def runs_client(runs_backend) -> Client:
    with Client(runs_backend.url, runs_backend.token) as client:
        yield client


# notebook front: an IPython shell with the extension loaded, connected to `backend` ---------------
from .notebook_fixtures import cortex_shell  # noqa: E402,F401

# Tinker face: the tinker SDK against `backend` -------------------------------------------------------
from .tinker_fixtures import hf_home, service_client, tinker_key  # noqa: E402,F401

# The unit layer: `live` marks every test that starts a process or a server (a backend, a Jupyter server, a
# kernel, Chromium, a Ray cluster, a subprocess); `python -m pytest -m "not live"` runs the rest in seconds.
# Marked here from what each test and its fixtures do, so a new test needs no decorator to be classed right.
LIVE_FIXTURES = frozenset(
    {
        "backend",
        "client",
        "tls_backend",
        "runs_backend",
        "runs_client",
        "cortex_shell",
        "service_client",
        "tinker_key",
        "hf_home",
    }
)
# What a test's (or its fixtures') source calls when it starts a process or a server.
LIVE_CALLS = (
    "start_backend",
    "subprocess",
    "Popen",
    "jupyter_process",
    "ray_cluster",
    "chromium",
    "playwright",
    "KernelManager",
    "start_new_kernel",
    "NotebookClient",
    "multiprocessing",
    "jp_fetch",
    "jp_serverapp",
    "Client.local",
    "ensure_local_backend",
    "os.fork",
)


def _source(function) -> str:
    import inspect

    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


_LIVE: dict[object, bool] = {}


def _starts_processes(function) -> bool:
    """True when the function's source starts a process, or calls a helper of the test package that does
    (followed through the names it uses, so `_nbval(...)` or `Kernel(...)` count as what they do)."""
    import inspect
    import re

    key = getattr(function, "__code__", function)
    if key in _LIVE:
        return _LIVE[key]
    _LIVE[key] = False  # a cycle counts as not live until something in it is
    source = _source(function)
    live = any(call in source for call in LIVE_CALLS)
    if not live:
        namespace = getattr(function, "__globals__", None)
        if namespace is None and inspect.isclass(function):
            namespace = vars(__import__("sys").modules.get(function.__module__, object))
        for name in set(re.findall(r"\b([A-Za-z_]\w*)\b", source)) & set(namespace or ()):
            helper = namespace[name]
            module = getattr(helper, "__module__", "") or ""
            if module.split(".")[0] == "tests" and (inspect.isfunction(helper) or inspect.isclass(helper)):
                if helper is not function and _starts_processes(helper):
                    live = True
                    break
    _LIVE[key] = live
    return live


def _is_live(item: pytest.Item) -> bool:
    if not isinstance(item, pytest.Function):
        return True  # notebooks under nbval run in a kernel of their own
    info = getattr(item, "_fixtureinfo", None)
    names = set(info.names_closure) if info is not None else set()
    if names & LIVE_FIXTURES:
        return True
    functions = [item.function]
    for name in names:
        for definition in (info.name2fixturedefs.get(name) or ()) if info is not None else ():
            if definition.func.__module__.split(".")[0] not in (
                "_pytest",
                "pytest_jupyter",
                "jupyter_server",
            ):
                functions.append(definition.func)
    return any(_starts_processes(function) for function in functions)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    live = pytest.mark.live
    for item in items:
        if _is_live(item):
            item.add_marker(live)
