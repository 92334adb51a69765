"""A kernel started by a real Jupyter server reaches a real backend through that server's proxy, with
only Jupyter's credentials: the backend token never enters the kernel."""

from __future__ import annotations

import json
import os
import textwrap

import httpx
import pytest
from jupyter_client import BlockingKernelClient

from cortex_nb import jupyter_proxy

from .jupyter_process import start_jupyter, start_jupyter_for

KERNEL_CODE = textwrap.dedent("""
    import json, os, cortex_nb
    from cortex_nb.jupyter_proxy import find_proxy_endpoint
    endpoint = find_proxy_endpoint()
    client = cortex_nb.Client(endpoint.url, endpoint.token, **endpoint.client_kwargs())
    job = client.create_job([{"type": "training", "base_model": "tiny"}], name="kernel-via-proxy")
    client.wait_for_job(job["job_id"], timeout_s=120)
    batch = {"input_ids": [[1, 2, 3, 4, 5]], "target_tokens": [[2, 3, 4, 5, 6]], "weights": [[1, 1, 1, 1, 1]]}
    loss = client.poll_request(job["job_id"], client.forward_backward(job["job_id"], batch), timeout_s=120)
    step = client.poll_request(job["job_id"], client.step(job["job_id"], 1e-3), timeout_s=120)
    logs = client.tail_logs(job["job_id"])
    cancelled = client.cancel_job(job["job_id"])
    print("RESULT" + json.dumps({
        "source": endpoint.source, "url": endpoint.url, "server_pid": endpoint.server_pid,
        "auth": dict(client.transport._http.headers), "environ": dict(os.environ),
        "job_id": job["job_id"], "loss_keys": sorted(loss), "step": step, "log_lines": len(logs["lines"]),
        "status": cancelled["status"], "backend_version": client.backend_version,
    }, default=str))
""")


@pytest.fixture
def jupyter_server(backend, tmp_path):
    server = start_jupyter_for(backend, tmp_path)
    yield server
    server.stop()


def run_in_kernel(server, code: str, timeout_s: float = 240) -> str:
    kernel = httpx.post(
        server.url + "api/kernels", json={"name": "python3"}, headers=server.headers(), timeout=60
    ).json()
    client = BlockingKernelClient(connection_file=str(server.runtime_dir / f"kernel-{kernel['id']}.json"))
    client.load_connection_file()
    client.start_channels(hb=False)  # no heartbeat: it reads as "dead" until its first beat
    try:
        client.wait_for_ready(timeout=60)
        output: list[str] = []
        errors: list[str] = []

        def on_message(message):
            if message["msg_type"] == "stream":
                output.append(message["content"]["text"])
            elif message["msg_type"] == "error":
                errors.append("\n".join(message["content"]["traceback"]))

        reply = client.execute_interactive(code, timeout=timeout_s, output_hook=on_message)
        assert reply["content"]["status"] == "ok", "\n".join(errors)
        return "".join(output)
    finally:
        client.stop_channels()
        httpx.delete(server.url + f"api/kernels/{kernel['id']}", headers=server.headers(), timeout=30)


def test_kernel_client_reaches_backend_through_the_proxy(jupyter_server, backend):
    output = run_in_kernel(jupyter_server, KERNEL_CODE)
    result = json.loads(output.split("RESULT", 1)[1])
    assert result["server_pid"] == jupyter_server.process.pid
    assert result["url"] == jupyter_server.url + "cortex/api"
    assert "the Jupyter server running this kernel" in result["source"]
    assert result["auth"]["authorization"] == f"token {jupyter_server.token}"
    assert result["loss_keys"] and result["step"]
    assert result["status"] == "cancelled"
    # The backend saw all of it, as the server token's owner.
    job = httpx.get(
        f"{backend.url}/v1/jobs/{result['job_id']}", headers={"Authorization": f"Bearer {backend.token}"}
    ).json()
    assert job["status"] == "cancelled" and job["name"] == "kernel-via-proxy"
    assert result["backend_version"]["service"] == "cortex-nb-backend"
    # The backend token is nowhere in the kernel: not in its environment, not in its client's headers.
    assert backend.token not in output
    assert not any(key.startswith(("CORTEX_URL", "CORTEX_TOKEN")) for key in result["environ"])


def test_no_jupyter_server_means_no_proxy_endpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    assert jupyter_proxy.find_proxy_endpoint() is None
    # A runtime file left by a server that died is ignored.
    (tmp_path / "jpserver-999999999.json").write_text(
        json.dumps({"pid": 999999999, "url": "http://127.0.0.1:1/", "token": "x"})
    )
    assert jupyter_proxy.find_proxy_endpoint() is None


def test_server_without_a_reachable_backend_says_why(tmp_path, monkeypatch):
    token_file = tmp_path / "backend.token"
    token_file.write_text("unused")
    server = start_jupyter(
        tmp_path / "jupyter", "http://127.0.0.1:9", token_file
    )  # nothing listens on port 9
    try:
        monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.runtime_dir))
        with pytest.raises(Exception) as caught:
            jupyter_proxy.find_proxy_endpoint()
        assert caught.value.code == "backend_unavailable"
        assert "http://127.0.0.1:9" in caught.value.message
        endpoint = jupyter_proxy.find_proxy_endpoint(probe=False)
        assert endpoint.server_pid == server.process.pid and endpoint.token == server.token
    finally:
        server.stop()


def test_ancestor_pids_lead_to_init():
    pids = jupyter_proxy.ancestor_pids()
    assert pids and pids[0] == os.getppid()
