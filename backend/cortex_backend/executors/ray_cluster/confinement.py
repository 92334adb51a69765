"""Where a Ray node cortex-nb starts listens, and where it keeps its files.

Ray's servers (GCS, raylet, object manager, agents) listen on loopback only when the node's address is
127.0.0.1, and on every interface otherwise. `ray start --node-ip-address 127.0.0.1` does not get there:
Ray swaps a loopback address (a node's, or the head's a client connects to) for the machine's outward
one. What does is Ray's own switch for single-machine clusters, under which Ray keeps 127.0.0.1: the
head of a backend serving on loopback starts under it, and the backend's own Ray client connects under
it. A host joining that head (on the same machine) cannot: Ray refuses to start a second node under the
switch. It runs Ray's CLI through ray_cli.py, which keeps the loopback address it was given, and its node
takes 127.0.0.1 as the address it reaches the head by. A backend serving on one outward address gives
Ray that address; Ray then still listens on every interface, and only its token keeps strangers out
(docs/security.md).

Ray makes its temporary dir, and every dir in it, world-writable (mode 0777). So Ray's dir goes inside a
private one (0700, this user's), which nobody else can enter.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
# Ray's switch: off, a node's address is 127.0.0.1 (Ray's clusters of one machine).
SINGLE_MACHINE_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
RAY_DIR_NAME = "ray"


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def head_binding(host: str) -> tuple[list[str], dict[str, str]]:
    """`ray start --head` arguments and environment that keep the head on the address the backend serves on."""
    if is_loopback(host):
        return [], dict(SINGLE_MACHINE_ENV)
    if host in WILDCARD_HOSTS:
        return [], {}
    return ["--node-ip-address", host], {}


def address_is_loopback(address: str) -> bool:
    """Whether a Ray "HOST:PORT" address is on loopback."""
    return is_loopback(address.rpartition(":")[0].strip("[]"))


def keep_loopback_in_this_process() -> None:
    """Let this process's Ray client reach a head on loopback (Ray would swap 127.0.0.1 for the outward
    address, where that head does not listen): Ray's single-machine switch, for this process and its
    children. Ray reads the switch into a constant when it is imported, so the constant is set too."""
    os.environ.update(SINGLE_MACHINE_ENV)
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


class PrivateDirError(Exception):
    """A dir meant to be private belongs to someone else."""


def private_root(path: Path | None, prefix: str = "cortex-ray-") -> tuple[Path, bool]:
    """A dir only this user may enter: `path` (made, or checked to be this user's, then set to 0700), or a
    fresh one in /tmp (short, as Ray's socket paths must be). Returns it and whether it was made here."""
    if path is None:
        return Path(tempfile.mkdtemp(prefix=prefix)), True
    path = path.expanduser().absolute()
    made = not path.exists()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PrivateDirError(f"{path} is not a directory of this user's; choose another Ray temp dir")
    os.chmod(path, 0o700)
    return path, made


def ray_temp_dir(root: Path) -> Path:
    """Ray's own temporary dir inside the private root (Ray sets it to 0777; the root keeps others out)."""
    return root / RAY_DIR_NAME


def remove_root(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
