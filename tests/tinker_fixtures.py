"""Fixtures for the Tinker face: the published `tinker` SDK (Python 3.11+) against the session's backend,
with a `tml-` key of its own owner, and the registered `cortex-test/tiny-llama`."""

from __future__ import annotations

import sys

import pytest

from .tokens import create_token

TINKER_MODEL = "cortex-test/tiny-llama"
NEEDS_SDK = pytest.mark.skipif(sys.version_info < (3, 11), reason="the tinker SDK needs Python 3.11 or newer")


@pytest.fixture(scope="session")
def tinker_key(backend) -> str:
    return create_token(backend.data_dir, "tinker-user", "jobs:read", "jobs:write", tinker=True)


@pytest.fixture
def service_client(backend, tinker_key):
    """A ServiceClient (one Tinker session) for one test, closed (its jobs completed) afterwards."""
    tinker = pytest.importorskip("tinker")
    client = tinker.ServiceClient(base_url=backend.url, api_key=tinker_key)
    yield client
    client.close("success").result()


@pytest.fixture(scope="session")
def hf_home(tmp_path_factory, llama_dir):
    """A Hugging Face cache holding `cortex-test/tiny-llama`'s tokenizer and config, copied from the registered
    model's directory: what `AutoTokenizer.from_pretrained("cortex-test/tiny-llama")` finds with
    HF_HUB_OFFLINE=1 (the SDK's get_tokenizer and the cookbook ask for tokenizers by name)."""
    import shutil

    home = tmp_path_factory.mktemp("hf-home")
    repo = home / "hub" / ("models--" + TINKER_MODEL.replace("/", "--"))
    revision = "0" * 39 + "1"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(llama_dir / name, snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return home
