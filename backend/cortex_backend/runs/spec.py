"""A submitted run spec (checked by its schema, `RunSpec`, in the body) checked against this backend:
registered models that can be staged and GPUs this host has."""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.run_spec import RunSpec

from ..models import ModelCatalog
from ..scheduler import Scheduler


def validate_run_spec(
    spec_or_raw: RunSpec | Any, catalog: ModelCatalog, scheduler: Scheduler
) -> dict[str, Any]:
    """The spec's normalised form, once this backend can run it (a body's spec comes parsed)."""
    parsed = spec_or_raw if isinstance(spec_or_raw, RunSpec) else RunSpec.parse(spec_or_raw)
    spec = parsed.normalised()
    for index, name in enumerate(spec["models"]):
        field = f"models[{index}]"
        if name not in catalog.names():
            raise ApiError(
                "spec_invalid",
                f"{field}: no model named {name!r} is registered; registered: {catalog.names()}",
                {"field": field},
            )
        if catalog.get(name).path is None:
            raise ApiError(
                "spec_invalid",
                f"{field}: {name!r} is built in and has no directory to stage; register a"
                " model directory with --model NAME=DIR",
                {"field": field},
            )
    gpu = spec["resources"]["gpu"]
    if gpu["count"]:
        min_memory = int(gpu["min_vram_gib"] * 2**30)
        if not scheduler.fits_ever(gpu["count"], min_memory, exclusive=True):
            have = len([device for device in scheduler.devices if device.kind == "cuda"])
            raise ApiError(
                "exceeds_capacity",
                f"resources.gpu.count: the run asks for {gpu['count']} GPU(s)"
                + (f" with at least {gpu['min_vram_gib']:g} GiB" if min_memory else "")
                + f" but this host has {have} GPU(s) (GET /v1/capacity lists them)",
                {"field": "resources.gpu.count"},
            )
    return spec
