"""Escape cases for what a sandboxed run could still reach through the backend's own process state: its
session keyring, its user's files under /etc, memory held in memfds (uncounted by a watched limit) and
the host paths in the sandbox's init command line. Judged from the host's side, as the rest of
tests/escape_suite.py."""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
from pathlib import Path

from .run_projects import write_project

# The keyring calls the planting side makes (x86_64 / aarch64 numbers).
_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}
KEY_SPEC_SESSION_KEYRING = -3
KEYCTL_REVOKE = 3
KEYCTL_SEARCH = 10

KEYRING_MAIN = r"""
import ctypes, json, os, sys
add_key, keyctl = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
libc = ctypes.CDLL(None, use_errno=True)
description, key_id, added = sys.argv[1], int(sys.argv[2]), sys.argv[3]
found = {}
key = libc.syscall(keyctl, 10, -3, b"user", description.encode(), 0)  # KEYCTL_SEARCH in @s
found["search"] = key
buffer = ctypes.create_string_buffer(256)
for name, target in (("read_found", key), ("read_by_id", key_id)):
    size = libc.syscall(keyctl, 11, target, buffer, 256) if target > 0 else -1  # KEYCTL_READ
    found[name] = buffer.raw[: max(size, 0)].decode(errors="replace") if size > 0 else None
found["add"] = libc.syscall(add_key, b"user", added.encode(), b"from-a-run", 10, -3)
json.dump(found, open("keyring.json", "w"))
"""

ETC_MAIN = r"""
import json, sys
found = {}
for path in sys.argv[1:]:
    try:
        found[path] = open(path).read(200)
    except OSError as exc:
        found[path] = "refused: " + type(exc).__name__
json.dump(found, open("etc.json", "w"))
"""

MEMFD_MAIN = r"""
import os, time
chunk = b"\1" * (16 * 1024 * 1024)
held = []
for _ in range(20):  # 20 memfds of 32 MiB (each under the per-file limit): 640 MiB, never mapped
    held.append(os.memfd_create("hold"))
    for _ in range(2):
        os.write(held[-1], chunk)
        time.sleep(0.02)
time.sleep(20)
"""

CMDLINE_MAIN = r"""
import json
json.dump({"init": open("/proc/1/cmdline", "rb").read().decode(errors="replace")}, open("cmdline.json", "w"))
"""


def _keyctl_calls() -> tuple[ctypes.CDLL, int, int]:
    add_key, keyctl = _SYSCALLS[os.uname().machine]
    return ctypes.CDLL(None, use_errno=True), add_key, keyctl


def _run(tier, work: Path, main: str, command: list[str], output: str) -> tuple[dict, dict | None]:
    with tier.client() as client:
        handle = client.run(
            write_project(
                work,
                main,
                name=output.split(".")[0],
                command=command,
                timeout_seconds=90,
                outputs={"result": {"path": output, "max_bytes": 1 << 20, "required": False}},
            )
        )
        final = handle.wait(180)
        if final["status"] != "done":
            return final, None
        return final, json.loads(handle.outputs("result", work / output).read_text())


def case_session_keyring(tier, work: Path) -> list:
    """A key in the backend's session keyring (which it shares with the login that started it): a run
    must neither read it nor add keys there."""
    from .escape_suite import Escape

    libc, add_key, keyctl = _keyctl_calls()
    description = f"cortex-canary-{secrets.token_hex(4)}"
    added = f"cortex-added-{secrets.token_hex(4)}"
    secret = secrets.token_hex(8)
    key_id = libc.syscall(
        add_key, b"user", description.encode(), secret.encode(), len(secret), KEY_SPEC_SESSION_KEYRING
    )
    if key_id < 0:
        return [Escape("session_keyring", f"could not plant a key: errno {ctypes.get_errno()}")]
    try:
        final, found = _run(
            tier, work, KEYRING_MAIN, ["python", "main.py", description, str(key_id), added], "keyring.json"
        )
        escapes = []
        if found is None:
            return [Escape("session_keyring", f"the probe run did not finish: {final}")]
        if secret in json.dumps(found):
            escapes.append(Escape("session_keyring", "a run read the backend's key"))
        planted = libc.syscall(keyctl, KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, b"user", added.encode(), 0)
        if planted > 0:
            libc.syscall(keyctl, KEYCTL_REVOKE, planted)
            escapes.append(Escape("session_keyring", "a run added a key to the backend's session keyring"))
        return escapes
    finally:
        libc.syscall(keyctl, KEYCTL_REVOKE, key_id)


def case_backend_files_under_etc(tier, work: Path) -> list:
    """The backend user's files under /etc (a TLS key in /etc/cortex, as deploying guides suggest, and a
    file of that user elsewhere in /etc, readable only by it): a run reads neither."""
    from .escape_suite import Escape

    owner = tier.user.uid if tier.user else 0
    secret = secrets.token_hex(8)
    tag = secrets.token_hex(4)
    # /etc/cortex is made if missing and left (empty) afterwards: runs of other tests started meanwhile saw
    # it and cover it with a tmpfs, and removing it under them fails their sandbox ("Can't mkdir /etc/cortex").
    cortex_dir = Path("/etc/cortex")
    own_dir = Path(f"/etc/cortex-escape-{tag}")
    planted = [cortex_dir / f"key-{tag}.pem", own_dir / "key.pem"]
    try:
        cortex_dir.mkdir(exist_ok=True)
        own_dir.mkdir()
        for path in planted:
            path.write_text(secret)
            os.chmod(path, 0o600)
            os.chown(path, owner, owner)
        os.chown(own_dir, owner, owner)
        final, found = _run(tier, work, ETC_MAIN, ["python", "main.py", *map(str, planted)], "etc.json")
        if found is None:
            return [Escape("backend_files_under_etc", f"the probe run did not finish: {final}")]
        return [
            Escape("backend_files_under_etc", f"a run read {path}")
            for path, text in found.items()
            if secret in text
        ]
    finally:
        shutil.rmtree(own_dir, ignore_errors=True)
        for path in planted[:1]:
            path.unlink(missing_ok=True)


def case_memory_in_memfd(tier, work: Path) -> list:
    """640 MiB written to a memfd and never mapped, under a 256 MiB limit: the run must be stopped."""
    from .escape_suite import Escape

    with tier.client() as client:
        handle = client.run(
            write_project(
                work, MEMFD_MAIN, name="memfd-fill", command=["python", "main.py"], timeout_seconds=90
            )
        )
        final = handle.wait(180)
    if final["status"] == "done" or final["failure_code"] != "workload_out_of_memory":
        return [
            Escape(
                "memory_in_memfd",
                f"the run was not stopped for memory: {final['status']} {final['failure_code']}",
            )
        ]
    return []


def case_init_command_line(tier, work: Path) -> list:
    """The sandbox's PID 1 must not show the host's paths (the binds' sources) in its command line."""
    from .escape_suite import Escape

    final, found = _run(tier, work, CMDLINE_MAIN, ["python", "main.py"], "cmdline.json")
    if found is None:
        return [Escape("init_command_line", f"the probe run did not finish: {final}")]
    shown = found["init"]
    host_paths = [str(tier.workspace), *tier.runtime, "--ro-bind", "--bind"]
    return [
        Escape("init_command_line", f"/proc/1/cmdline shows {path}") for path in host_paths if path in shown
    ]


RESIDUE_CASES = {
    "session_keyring": case_session_keyring,
    "backend_files_under_etc": case_backend_files_under_etc,
    "memory_in_memfd": case_memory_in_memfd,
    "init_command_line": case_init_command_line,
}
