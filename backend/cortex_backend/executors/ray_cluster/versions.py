"""The versions a host must share with the head: a sub-job's actor runs the head's code on the host's
Python, torch and Ray, so a mismatch would fail in confusing ways later (or compute something else)."""

from __future__ import annotations

import importlib.metadata
import sys

# What is compared, in the order a message names them.
COMPONENTS = ("python", "torch", "cortex-nb", "ray")


def local_versions() -> dict[str, str]:
    """This interpreter's versions (read from package metadata: no torch import)."""
    from cortex_nb.protocol.versions import __version__

    return {
        "python": ".".join(str(part) for part in sys.version_info[:3]),
        "torch": _installed("torch"),
        "cortex-nb": __version__,
        "ray": _installed("ray"),
    }


def _installed(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def comparable(component: str, version: str) -> str:
    """The part of a version that must match: Python's major.minor (Ray's own rule), torch's public
    version (a CPU head and a CUDA host differ only in the local tag, "+cpu" vs "+cu128")."""
    if component == "python":
        return ".".join(version.split(".")[:2])
    if component == "torch":
        return version.split("+", 1)[0]
    return version


def mismatches(head: dict[str, str], here: dict[str, str]) -> list[str]:
    """One line per component whose version differs, e.g. "torch: head 2.13.0, this host 2.12.1"."""
    return [
        f"{component}: head {head.get(component, 'unknown')}, this host {here.get(component, 'unknown')}"
        for component in COMPONENTS
        if comparable(component, head.get(component, "")) != comparable(component, here.get(component, ""))
    ]
