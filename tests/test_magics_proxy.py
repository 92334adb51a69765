"""%cortex connect with nothing configured, in a kernel run by a real Jupyter server with the cortex
server extension: the magics reach the real backend through the server's proxy."""

from __future__ import annotations

import httpx
from jupyter_client import BlockingKernelClient

from .jupyter_process import start_jupyter_for
from .notebook_fixtures import DEMO_TEXT

CELLS = [
    "%load_ext cortex_nb\n%cortex connect\n%cortex status",
    (
        "%%cortex train -o job --name via-proxy\n"
        f"base_model: tiny\ndata: {DEMO_TEXT}\nsteps: 4\nbatch_size: 2\nmax_seq_len: 32\nkeep_alive: 5m\n"
    ),
    "print('JOB', job.job_id)\n%cortex logs {job.job_id} -n 2\nprint(job.cancel()['status'])",
]


def execute(server, cells: list[str], timeout_s: float = 240) -> list[str]:
    kernel = httpx.post(
        server.url + "api/kernels", json={"name": "python3"}, headers=server.headers(), timeout=60
    ).json()
    client = BlockingKernelClient(connection_file=str(server.runtime_dir / f"kernel-{kernel['id']}.json"))
    client.load_connection_file()
    client.start_channels(hb=False)
    try:
        client.wait_for_ready(timeout=60)
        outputs = []
        for code in cells:
            chunks: list[str] = []

            def collect(message, chunks=chunks):
                if message["msg_type"] == "stream":
                    chunks.append(message["content"]["text"])
                elif message["msg_type"] == "error":
                    chunks.append(
                        "ERROR " + message["content"]["ename"] + ": " + message["content"]["evalue"]
                    )

            reply = client.execute_interactive(code, timeout=timeout_s, output_hook=collect)
            text = "".join(chunks)
            assert reply["content"]["status"] == "ok", text
            outputs.append(text)
        return outputs
    finally:
        client.stop_channels()
        httpx.delete(server.url + f"api/kernels/{kernel['id']}", headers=server.headers(), timeout=30)


def test_connect_goes_through_the_jupyter_proxy_when_nothing_else_is_configured(
    backend, tmp_path, monkeypatch
):
    monkeypatch.setenv("CORTEX_CONFIG", str(tmp_path / "absent.toml"))  # no default profile either
    monkeypatch.setenv("CORTEX_NONINTERACTIVE", "1")
    server = start_jupyter_for(backend, tmp_path)
    try:
        connect, train, finish = execute(server, CELLS)
    finally:
        server.stop()
    assert connect.startswith(f"connected to {server.url}cortex/api (backend ")
    assert "via the Jupyter server running this kernel" in connect
    assert "token: the Jupyter server's (token details are not forwarded by its proxy)" in connect
    assert "(tiny) sampling: 4/4 steps" in train  # trained on the backend, kept alive
    job_id = finish.split()[1]
    assert finish.rstrip().endswith("cancelled")
    assert "[engine] step=4 " in finish
    assert backend.token not in connect + train + finish
    job = httpx.get(
        f"{backend.url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {backend.token}"}
    ).json()
    assert job["name"] == "via-proxy" and job["status"] == "cancelled"
