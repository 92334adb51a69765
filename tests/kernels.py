"""Real IPython kernels driven as a notebook front end drives them (jupyter_client): start, execute,
restart, shut down."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from jupyter_client.manager import KernelManager


class Kernel:
    """One ipykernel of this Python, with its own environment and working folder."""

    def __init__(self, env: Mapping[str, str], cwd: Path) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(env=dict(env), cwd=str(cwd))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def run(self, code: str, timeout_s: float = 300) -> str:
        """Execute a cell; returns what it printed (stdout and results). Raises if the cell failed."""
        printed: list[str] = []
        errors: list[str] = []

        def collect(message: dict) -> None:
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                (errors if content["name"] == "stderr" and "Error" in content["text"] else printed).append(
                    content["text"]
                )
            elif kind in ("execute_result", "display_data"):
                printed.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                errors.append(f"{content['ename']}: {content['evalue']}")

        reply = self.client.execute_interactive(code, timeout=timeout_s, output_hook=collect)
        if reply["content"]["status"] != "ok" or errors:
            raise AssertionError(f"the cell failed: {errors or reply['content']}\n--- cell ---\n{code}")
        return "".join(printed)

    def restart(self) -> None:
        """What Kernel > Restart does: the kernel process is replaced; its state is gone."""
        self.manager.restart_kernel(now=True)
        self.client.wait_for_ready(timeout=120)

    @property
    def pid(self) -> int:
        return self.manager.provisioner.pid

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def kernel_env(local_dir: Path, **extra: str) -> dict[str, str]:
    """This process's environment for a kernel, with its own local-backend folder and widgets on."""
    env = {key: value for key, value in os.environ.items() if key != "CORTEX_NONINTERACTIVE"}
    env.update(CORTEX_LOCAL_DIR=str(local_dir), CORTEX_DISABLE_TELEMETRY="1", **extra)
    return env
