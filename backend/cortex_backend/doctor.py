"""`cortex-nb doctor`: what this host gives a backend, in plain lines, before anyone submits a run.

bubblewrap (the source-run sandbox; without it source runs are refused unless the backend is started with
--allow-unsandboxed-runs), user namespaces (what bubblewrap needs as an ordinary user), cgroups (per-run
memory, process and CPU limits) and GPUs (NVML). The backend logs the same facts when it starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import nvml
from .runs.cgroups import detect
from .runs.isolation import probe_bubblewrap, unavailable_message


def _sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name.replace(".", "/")).read_text().strip()
    except OSError:
        return None


def user_namespaces() -> str:
    limit = _sysctl("user.max_user_namespaces")
    if limit == "0":
        return "off (user.max_user_namespaces = 0)"
    clone = _sysctl("kernel.unprivileged_userns_clone")
    if clone == "0":
        return "off for ordinary users (kernel.unprivileged_userns_clone = 0)"
    apparmor = _sysctl("kernel.apparmor_restrict_unprivileged_userns")
    if apparmor == "1":
        return "restricted by AppArmor (kernel.apparmor_restrict_unprivileged_userns = 1)"
    return f"available (at most {limit} per user)" if limit else "unknown (no /proc/sys/user)"


def gpus() -> str:
    module = nvml.nvml()
    if module is None:
        return f"none usable: {nvml.unavailable_reason()}"
    count = module.nvmlDeviceGetCount()
    names = []
    for index in range(count):
        name = module.nvmlDeviceGetName(module.nvmlDeviceGetHandleByIndex(index))
        names.append(name.decode() if isinstance(name, bytes) else str(name))
    return f"{count}: " + ", ".join(names) if count else "NVML sees no GPU"


def report() -> list[tuple[str, str]]:
    """(what, finding) rows; the last says whether source runs will be accepted."""
    sandbox = probe_bubblewrap(None)
    cgroups = detect("doctor")
    try:
        cgroup_text = cgroups.describe()
    finally:
        cgroups.remove()
    rows = [
        ("bubblewrap", f"works ({sandbox.bwrap})" if sandbox.bwrap else f"NO: {sandbox.problem}"),
        ("user namespaces", user_namespaces()),
        ("cgroups", cgroup_text),
        ("GPUs", gpus()),
        (
            "running as",
            f"uid {os.geteuid()}" + (" (root: each run gets a uid of its own)" if os.geteuid() == 0 else ""),
        ),
    ]
    if sandbox.bwrap:
        rows.append(("source runs", "accepted, each in a bubblewrap sandbox"))
    else:
        rows.append(("source runs", "REFUSED: " + unavailable_message(sandbox.problem)))
    return rows


def print_report() -> int:
    rows = report()
    width = max(len(name) for name, _ in rows)
    for name, finding in rows:
        print(f"{name.ljust(width)}  {finding}")
    return 0
