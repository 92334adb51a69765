"""What each process loads: the backend, its workers and the Jupyter proxy load the contract
(`cortex_nb.protocol`), never the kernel SDK, httpx, pandas or widgets; the kernel side never torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SDK_MODULES = ("httpx", "pandas", "ipywidgets", "IPython", "cortex_nb.client", "cortex_nb.training")


def loaded_after(statement: str, watched: tuple[str, ...]) -> list[str]:
    """The watched modules a fresh interpreter has loaded after running `statement`."""
    code = f"import json, sys\n{statement}\nprint(json.dumps([m for m in {list(watched)!r} if m in sys.modules]))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "module",
    [
        "cortex_backend.worker_process",
        "cortex_backend.worker",
        "cortex_backend.app",
        "cortex_backend.server",
        "cortex_server.app",
    ],
)
def test_backend_worker_and_proxy_load_only_the_protocol(module):
    assert loaded_after(f"import {module}", SDK_MODULES) == []


def test_importing_cortex_nb_loads_nothing_heavy_until_a_name_is_used():
    assert loaded_after("import cortex_nb, cortex_nb.protocol.routes", (*SDK_MODULES, "torch")) == []
    # The public names still resolve, on first use.
    assert loaded_after(
        "import cortex_nb; cortex_nb.Client; cortex_nb.NotFoundError", ("cortex_nb.client", "torch")
    ) == ["cortex_nb.client"]


def test_the_protocol_imports_neither_torch_nor_httpx():
    statement = (
        "import pkgutil, importlib, cortex_nb.protocol as p\n"
        + "[importlib.import_module(m.name) for m in pkgutil.walk_packages(p.__path__, 'cortex_nb.protocol.')]"
    )
    assert loaded_after(statement, ("torch", "httpx", "cortex_nb.client", "pandas")) == []


def test_unknown_names_still_raise_attribute_error():
    import cortex_nb

    with pytest.raises(AttributeError):
        cortex_nb.NoSuchThing  # noqa: B018


def test_all_names_every_lazy_export():
    import cortex_nb

    assert set(cortex_nb.__all__) == {"API_VERSION", "__version__", *cortex_nb._EXPORTS}


def test_former_module_names_are_the_moved_modules_and_say_so():
    # A fresh interpreter: the warning is given once, on the first import of a former name.
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    import cortex_nb.wire\nexcept DeprecationWarning as w:\n    print(w)\n"
        "warnings.simplefilter('ignore')\n"
        "import sys, cortex_nb.states, cortex_nb.protocol.states, cortex_nb.job_spec, cortex_nb.run_spec\n"
        "print(sys.modules['cortex_nb.states'] is cortex_nb.protocol.states,"
        " sys.modules['cortex_nb.job_spec'] is cortex_nb.run_spec)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    warning, same = done.stdout.splitlines()
    assert "cortex_nb.wire is now cortex_nb.protocol.wire" in warning and "next release" in warning
    assert same == "True True"
