"""Where a sampling session's requests run. Sampling a checkpoint needs a sub-job of the same base model and
LoRA shape (engine/saved_adapters.py swaps the checkpoint in per request): the trainer that saved it while it
runs, which costs nothing, and otherwise one sampler job per owner, base model and LoRA shape, shared by all
of that owner's sampling sessions. Those are ordinary jobs; they finish when idle like any other, and with parking
on (`--park-idle-s`) after that many idle seconds: a sampler holds no state to save, so its next sample starts one
again instead of a device slot staying held by a client that has stopped sampling.
"""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.base import parse
from cortex_nb.protocol.schemas.jobs import CreateJob

from ...auth import Principal
from ...service import Service
from .sessions import SamplingSession

ALIVE = (states.JOB_PENDING, states.JOB_STARTING, states.JOB_RUNNING)


class SamplerHosts:
    def __init__(self, service: Service) -> None:
        self.service = service
        self._jobs: dict[tuple[str, str, str], str] = {}

    def alive(self, job: dict[str, Any] | None) -> bool:
        return job is not None and job["status"] in ALIVE and not self.service.jobs.is_completing(job["id"])

    def host(self, principal: Principal, sampler: SamplingSession) -> tuple[str, Any]:
        """(job id, adapter) for one sample request of this sampling session."""
        store = self.service.store
        if sampler.live_job_id is not None:
            job = store.get_job(sampler.live_job_id)
            if not self.alive(job):
                raise ApiError(
                    "job_finished",
                    f"the training client behind inflight sampler {sampler.id} has ended;"
                    " save weights and create a sampling client from the path",
                )
            return sampler.live_job_id, None
        if sampler.checkpoint is None:
            return self._sampler_job(principal, sampler.base_model, {}), "base"
        job_id, checkpoint_id = sampler.checkpoint
        adapter = {"job_id": job_id, "checkpoint_id": checkpoint_id}
        source = store.get_job(job_id)
        if (
            self.alive(source)
            and source["owner"] == principal.owner
            and any(s["type"] == states.TRAINING for s in source["sub_jobs"])
        ):
            return job_id, adapter
        row = self.service.checkpoints.find(principal, principal.owner, job_id, checkpoint_id, reading=True)
        shape = row["manifest"].get("adapter") or {}
        lora = {
            "r": shape.get("r"),
            "alpha": shape.get("lora_alpha"),
            "target_modules": shape.get("target_modules"),
        }
        return self._sampler_job(principal, row["base_model"], lora), adapter

    def _sampler_job(self, principal: Principal, base_model: str, lora: dict[str, Any]) -> str:
        key = (principal.owner, base_model, repr(sorted(lora.items())))
        job = self.service.store.get_job(self._jobs[key]) if key in self._jobs else None
        if not self.alive(job):
            spec = {
                "name": f"tinker sampler {base_model}",
                "experiment": "tinker",
                "labels": {"api": "tinker"},
                "sub_jobs": [{"type": states.SAMPLING, "base_model": base_model, "lora": lora}],
            }
            if self.service.settings.park_idle_s is not None:
                spec["idle_timeout_s"] = self.service.settings.park_idle_s
            job = self.service.jobs.create(principal, parse(CreateJob, spec))
            self._jobs[key] = job["id"]
        return job["id"]
