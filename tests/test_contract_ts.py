"""The panel's TypeScript copy of the contract (labextension/src/contract.ts) matches the Python source
of truth, and the labextension's version is the package's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from cortex_nb.protocol import errors, routes, states
from cortex_nb.protocol.versions import __version__

ROOT = Path(__file__).resolve().parent.parent


def test_generated_contract_is_up_to_date():
    result = subprocess.run(
        [sys.executable, "scripts/generate_contract.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_contract_holds_every_proxied_route_and_state():
    text = (ROOT / "labextension" / "src" / "contract.ts").read_text()
    for route in routes.ROUTES:
        entry = f'{route.name}: {{ name: "{route.name}", method: "{route.method}", template: "{route.template}" }}'
        assert (entry in text) == route.proxied, route.name
    for state in (*states.JOB_STATES, *states.REQUEST_STATES, *errors.FAILURE_CODES):
        assert f'"{state}"' in text


def test_labextension_version_is_the_package_version():
    package = json.loads((ROOT / "labextension" / "package.json").read_text())
    assert package["version"] == __version__
    assert package["jupyterlab"]["outputDir"] == "../cortex_nb/labextension"


def declared_keys(interface: str) -> set[str]:
    """The property names of one `export interface` in labextension/src/types.ts."""
    text = (ROOT / "labextension" / "src" / "types.ts").read_text()
    block = re.search(r"export interface " + interface + r"\b[^{]*\{\n(.*?)\n\}", text, re.S)
    assert block, f"types.ts declares no interface {interface}"
    return set(re.findall(r"^  (\w+)\??:", block.group(1), re.M))


def test_panel_types_declare_the_job_json_the_backend_sends(client):
    job = client.create_job([{"type": "sampling", "base_model": "tiny"}], name="keys")
    try:
        sent = client.get_job(job["job_id"])
    finally:
        client.cancel_job(job["job_id"])
    assert declared_keys("IJobView") == set(sent), (
        "labextension/src/types.ts IJobView differs from GET /v1/jobs/{id}"
    )
    assert declared_keys("ISubJobView") == set(sent["sub_jobs"][0])


def test_panel_types_declare_the_progress_record_the_backend_sends():
    from cortex_backend.progress import ProgressRecord

    sent = set(ProgressRecord("managed").to_json())
    assert declared_keys("IProgress") == sent, (
        "labextension/src/types.ts IProgress differs from the backend's"
    )
