"""Fault injection for tests of failure paths that cannot be produced on demand otherwise.

A corrupted weight transfer or a process killed in the middle of writing a file are real events on
real machines, but no test can wait for one. A backend started with `--fault-injection NAME` (or
`NAME=SUB_JOB_ID` or `NAME=JOB_ID` to limit it to one sub-job or job) makes its workers misbehave in that one named way.
Off by default; the backend logs a warning when any fault is on. Never enable it in production.
"""

from __future__ import annotations

from collections.abc import Iterable

FAULTS: dict[str, str] = {
    "pause_mid_save": "a save writes half of adapter_model.safetensors, then sleeps for 120 s (kill it then)",
    "corrupt_sync_base": "a weight-sync target perturbs one of its weights before reporting its base hash",
    "corrupt_sync_delta": "a weight-sync target changes one value of a delta after decoding it",
    "corrupt_sync_bytes": "a weight-sync target flips one byte of a compressed delta before decoding it",
    "corrupt_sync_full": "a weight-sync target changes one value of full weights after decoding them (the sync fails)",
    "fail_forward_backward": "forward_backward raises an error the engine does not expect (a bug, say)",
    "nan_loss": "forward_backward's loss (and so its gradients) is NaN, as a bad batch makes it",
    "oom_forward": "forward runs out of device memory",
    "oom_generate": "generate runs out of device memory (alone, or in any pass it shares with other slots)",
    "fail_training_loop": "a managed training loop raises an error the engine does not expect after its data loads",
    "oom_training_loop": "a managed training loop runs out of device memory after its data loads",
}


def parse_fault(value: str) -> str:
    """Validate `NAME` or `NAME=SUB_JOB_ID` (argparse type)."""
    name = value.partition("=")[0]
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known: {sorted(FAULTS)}")
    return value


class Faults:
    """The faults active in one sub-job's worker."""

    def __init__(self, specs: Iterable[str] = (), sub_job_id: str = "", job_id: str = "") -> None:
        self.active_names: set[str] = set()
        for spec in specs:
            name, _, only = spec.partition("=")
            if not only or only in (sub_job_id, job_id):
                self.active_names.add(name)

    def active(self, name: str) -> bool:
        return name in self.active_names

    def raise_in(self, operation: str) -> None:
        """Raise what a fault makes `operation` raise, if any: a data-plane operation's name, or
        `training_loop_data_loaded` (a managed loop, once its data is loaded)."""
        if operation == "forward_backward" and self.active("fail_forward_backward"):
            raise RuntimeError("injected failure (fault fail_forward_backward)")
        if operation == "generate" and self.active("oom_generate"):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (fault oom_generate)")
        if operation == "forward" and self.active("oom_forward"):
            # The message torch gives when a CUDA allocation fails; the engine recognises it by these words.
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (fault oom_forward)")
        if operation == "training_loop_data_loaded" and self.active("fail_training_loop"):
            raise RuntimeError("injected failure (fault fail_training_loop)")
        if operation == "training_loop_data_loaded" and self.active("oom_training_loop"):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (fault oom_training_loop)")
