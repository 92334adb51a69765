"""The source-run escape suite: hostile runs against a real backend, in two tiers (a root backend, and a
backend run as an ordinary user). Shared by tests/test_run_escapes.py and bench/bench_escapes.py.

Every case returns a list of `Escape`s (empty when the sandbox held) checked from both sides: what the
run reports it managed, and what the host saw (files that appeared, connections that arrived, processes
left, memory and disk used).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cortex_nb import Client

from .backend_process import BackendProcess, start_backend
from .escape_residue import RESIDUE_CASES
from .run_projects import processes_with, wait_for_log, write_project
from .unprivileged import UserHome, make_user_home, unavailable_reason

MIB = 2**20
# The limits both tiers' backends run with: small, so filling them is quick.
RUN_MEMORY_MIB = 256
RUN_PROCESSES = 64
RUN_DISK_MIB = 64
RUN_TMP_MIB = 32
BACKEND_ARGS = (
    "--devices",
    "cpu:2",
    "--warm-workers",
    "0",
    "--run-kill-grace",
    "1",
    "--run-memory-mib",
    str(RUN_MEMORY_MIB),
    "--run-max-processes",
    str(RUN_PROCESSES),
    "--run-disk-mib",
    str(RUN_DISK_MIB),
    "--run-tmp-mib",
    str(RUN_TMP_MIB),
)
TIERS = ("root", "unprivileged")
# What the last cases measured, per (tier, case): for the bench's table.
OBSERVED: dict[tuple[str, str], str] = {}


@dataclass
class Escape:
    case: str
    what: str

    def __str__(self) -> str:
        return f"{self.case}: {self.what}"


@dataclass
class Tier:
    """A running backend of one tier and what a run must not reach on its host."""

    name: str
    backend: BackendProcess
    home: Path  # the backend user's $HOME
    runtime: list[str]  # the backend's Python installation (site-packages first)
    workspace: Path
    run_tokens: dict[str, str]
    user: UserHome | None = None

    def client(self, owner: str = "alice") -> Client:
        return Client(self.backend.url, self.run_tokens[owner])

    def stop(self) -> None:
        self.backend.stop()
        if self.user is not None:
            self.user.remove()


def tier_unavailable(name: str) -> str | None:
    if name == "unprivileged":
        return unavailable_reason()
    if os.geteuid() != 0:
        return "the tests are not running as root"
    return None


def start_tier(name: str, root: Path) -> Tier:
    if name == "root":
        import sysconfig

        from cortex_backend.auth import create_token
        from cortex_backend.store import Store

        data_dir = root / "root-backend"
        data_dir.mkdir(parents=True)
        store = Store(data_dir / "cortex.sqlite3")
        tokens = {
            owner: create_token(store, owner, ["jobs:read", "runs:write"]) for owner in ("alice", "bob")
        }
        store.close()
        # A run-uid pool of its own: on a shared machine the default one may be in use by other backends.
        base = 1_600_000_000 + secrets.randbelow(10**6) * 16
        backend = start_backend(data_dir, *BACKEND_ARGS, "--run-uid-base", str(base))
        runtime = [sysconfig.get_paths()["purelib"], os.path.realpath(sys.base_prefix)]
        return Tier(name, backend, Path(os.path.expanduser("~")), runtime, data_dir / "workspace", tokens)
    user = make_user_home()
    try:
        tokens = {owner: user.create_token(owner, "jobs:read", "runs:write") for owner in ("alice", "bob")}
        backend = user.start_backend(*BACKEND_ARGS)
    except BaseException:
        user.remove()
        raise
    return Tier(
        name,
        backend,
        user.home,
        [str(user.site_packages), str(Path(user.python).parent.parent)],
        user.data_dir / "workspace",
        tokens,
        user,
    )


# listeners on the host ------------------------------------------------------------------------------
class Listeners:
    """A loopback TCP server and unix-socket servers in the places a run might look; counts connections."""

    def __init__(self, socket_dirs: list[Path], owner_uid: int | None) -> None:
        self.accepted: list[str] = []
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.servers: list[tuple[str, socket.socket]] = [("tcp", self.tcp)]
        self.unix_paths: list[str] = []
        tag = secrets.token_hex(4)
        for folder in socket_dirs:
            path = folder / f"cortex-escape-{tag}.sock"
            try:
                server = socket.socket(socket.AF_UNIX)
                server.bind(str(path))
            except OSError:
                continue
            os.chmod(path, 0o777)  # anyone on the host may connect: only the sandbox keeps a run out
            if owner_uid is not None:
                os.chown(path, owner_uid, owner_uid)
            server.listen(16)
            self.servers.append((str(path), server))
            self.unix_paths.append(str(path))
        self.abstract = f"cortex-escape-{tag}"
        abstract = socket.socket(socket.AF_UNIX)
        abstract.bind("\0" + self.abstract)
        abstract.listen(16)
        self.servers.append(("@" + self.abstract, abstract))
        for name, server in self.servers:
            threading.Thread(target=self._accept, args=(name, server), daemon=True).start()

    @property
    def tcp_port(self) -> int:
        return self.tcp.getsockname()[1]

    def _accept(self, name: str, server: socket.socket) -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            self.accepted.append(name)
            connection.close()

    def close(self) -> None:
        for name, server in self.servers:
            server.close()
            if name.startswith("/"):
                Path(name).unlink(missing_ok=True)


# the probes a run executes ----------------------------------------------------------------------------
PROBE_MAIN = r"""
import ctypes, json, os, socket
ARGS = json.loads(%(args)r)
results = {}

def attempt(name, function):
    try:
        results[name] = {"ok": True, "value": function()}
    except Exception as exc:
        results[name] = {"ok": False, "value": (type(exc).__name__ + ": " + str(exc))[:300]}

def create(path):
    with open(path, "x") as handle:
        handle.write("import os  # planted by a run\n")
    return path

for folder in ARGS["runtime"]:
    attempt("write_runtime:" + folder, lambda folder=folder: create(os.path.join(folder, ARGS["planted"])))
def append_bashrc():
    with open(os.path.join(ARGS["home"], ".bashrc"), "a") as handle:
        if ARGS["append_bashrc"]:  # only in a home the tests made, never a real user's
            handle.write("echo " + ARGS["planted"] + "\n")

attempt("append_home_bashrc", append_bashrc)
for folder in ("/", "/usr", "/etc", "/var", "/opt", "/srv", "/root", "/home", ARGS["home"]):
    attempt("write:" + folder, lambda folder=folder: create(os.path.join(folder, ARGS["planted"])))
# Files the host planted where a run must not look: read them, and list their folders.
for path in ARGS["canaries"]:
    attempt("read:" + path, lambda path=path: open(path).read(200))
    attempt("list:" + os.path.dirname(path), lambda path=path: os.listdir(os.path.dirname(path)))
for name in ("token_file", "db_file"):
    attempt("read:" + ARGS[name], lambda name=name: open(ARGS[name], errors="replace").read(200))
attempt("list:" + ARGS["workspace"], lambda: os.listdir(ARGS["workspace"]))

def tcp(port):
    socket.create_connection(("127.0.0.1", port), timeout=2).close()

attempt("tcp:loopback_listener", lambda: tcp(ARGS["tcp_port"]))
attempt("tcp:backend_port", lambda: tcp(ARGS["backend_port"]))

def unix(address):
    client = socket.socket(socket.AF_UNIX)
    client.settimeout(2)
    client.connect(address)
    client.close()

for path in ARGS["unix_sockets"]:
    attempt("unix:" + path, lambda path=path: unix(path))
attempt("unix:abstract", lambda: unix("\0" + ARGS["abstract"]))

def new_user_namespace():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        raise OSError(ctypes.get_errno(), "unshare refused")

attempt("new_user_namespace", new_user_namespace)
json.dump(results, open("escapes.json", "w"), indent=1)
"""


def _finish(handle, timeout_s: float = 180.0) -> dict[str, Any]:
    return handle.wait(timeout_s)


def _plant_canaries(folders: list[Path], owner_uid: int | None, secret: str) -> list[Path]:
    """A file holding `secret` in each folder (its name holds something else, so an error naming the
    path does not look like a read)."""
    tag = secrets.token_hex(4)
    planted = []
    for folder in folders:
        path = folder / f"cortex-canary-{tag}"
        try:
            path.write_text(secret)
        except OSError:
            continue
        os.chmod(path, 0o644)  # readable by anyone on the host: only the sandbox keeps a run out
        if owner_uid is not None:
            os.chown(path, owner_uid, owner_uid)
        planted.append(path)
    return planted


def case_filesystem_and_network(tier: Tier, work: Path) -> list[Escape]:
    """Write the runtime and $HOME, read $HOME, the token, the store and host socket dirs, reach loopback
    TCP, unix sockets in those dirs, in the runtime and an abstract one, create a user namespace."""
    planted = f"zz-cortex-escape-{secrets.token_hex(4)}.pth"
    secret = secrets.token_hex(8)
    owner_uid = tier.user.uid if tier.user else None
    places = [Path("/tmp"), Path("/var/tmp"), tier.home, tier.backend.data_dir, tier.workspace]
    places += [Path(folder) for folder in ("/run", "/run/lock", "/dev/shm") if os.path.isdir(folder)]
    # And inside the runtime the run's python comes from (bound read-only): a host process listening there.
    socket_dirs = [place for place in places if place != tier.workspace] + [
        Path(path) for path in tier.runtime
    ]
    listeners = Listeners(socket_dirs, owner_uid)
    canaries = _plant_canaries(places, owner_uid, secret)
    token = (tier.backend.data_dir / "admin.token").read_text().strip()
    args = {
        "runtime": tier.runtime,
        "home": str(tier.home),
        "planted": planted,
        "canaries": [str(path) for path in canaries],
        "token_file": str(tier.backend.data_dir / "admin.token"),
        "db_file": str(tier.backend.data_dir / "cortex.sqlite3"),
        "workspace": str(tier.workspace),
        "tcp_port": listeners.tcp_port,
        "backend_port": int(tier.backend.url.rsplit(":", 1)[1]),
        "unix_sockets": listeners.unix_paths,
        "abstract": listeners.abstract,
        "append_bashrc": tier.user is not None,
    }
    escapes: list[Escape] = []
    bashrc = tier.home / ".bashrc"
    bashrc_before = bashrc.stat().st_mtime_ns if bashrc.exists() else None
    try:
        with tier.client() as client:
            spec = write_project(
                work,
                PROBE_MAIN % {"args": json.dumps(args)},
                name="escape-probe",
                outputs={"escapes": {"path": "escapes.json", "max_bytes": 1 << 20}},
            )
            handle = client.run(spec)
            final = _finish(handle)
            if final["status"] != "done":
                return [Escape("filesystem_and_network", f"the probe run did not finish: {final}")]
            results = json.loads(handle.outputs("escapes", work / "escapes.json").read_text())
    finally:
        listeners.close()
        for path in canaries:
            path.unlink(missing_ok=True)
    OBSERVED[(tier.name, "filesystem_and_network")] = (
        f"{len(results)} probes; the host saw {len(listeners.accepted)} connection(s) and no planted file"
    )
    # Judged by what is really the host's: a write into a private tmpfs, or a listing of one, is no escape.
    for name, result in results.items():
        text = json.dumps(result["value"])
        seen_canary = any(name.startswith("list:") and path.name in text for path in canaries)
        if secret in text or token in text or "SQLite format" in text or seen_canary:
            escapes.append(Escape(name, text[:200]))
        elif name.startswith(("tcp:", "unix:", "new_user_namespace")) and result["ok"]:
            escapes.append(Escape(name, "connected" if name != "new_user_namespace" else "created"))
    for folder in [
        *tier.runtime,
        str(tier.home),
        "/",
        "/usr",
        "/etc",
        "/var",
        "/opt",
        "/srv",
        "/root",
        "/home",
    ]:
        path = Path(folder) / planted
        if path.exists():
            escapes.append(Escape("host_file_planted", str(path)))
            path.unlink()
    if bashrc.exists() and (
        bashrc.stat().st_mtime_ns != bashrc_before or planted in bashrc.read_text(errors="replace")
    ):
        escapes.append(Escape("host_bashrc_changed", str(bashrc)))
    for name in listeners.accepted:
        escapes.append(Escape("host_connection_arrived", name))
    return escapes


LEFTOVER_PLACES = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/run", "/tmp/cortex-run/..")

LEAVE_MAIN = r"""
import json, os
secret, places = %(secret)r, %(places)r
left = []
for folder in places:
    try:
        path = os.path.join(folder, "alice-secret-" + secret)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, secret.encode())
        os.close(fd)
        left.append(path)
    except OSError:
        pass
print("left", left)
"""

FIND_MAIN = r"""
import json, os
secret, places = %(secret)r, %(places)r
found = []
for folder in places:
    try:
        names = os.listdir(folder)
    except OSError:
        continue
    for name in names:
        path = os.path.join(folder, name)
        try:
            if secret in name or secret in open(path, errors="replace").read(4096):
                found.append(path)
        except OSError:
            continue
json.dump({"found": found}, open("found.json", "w"))
"""


def case_other_runs_leftovers(tier: Tier, work: Path) -> list[Escape]:
    """Alice's run leaves 0600 files in every shared place it can; Bob's next run looks for them."""
    secret = secrets.token_hex(8)
    escapes: list[Escape] = []
    with tier.client("alice") as alice:
        handle = alice.run(
            write_project(
                work / "leave", LEAVE_MAIN % {"secret": secret, "places": LEFTOVER_PLACES}, name="leave-files"
            )
        )
        if _finish(handle)["status"] != "done":
            return [Escape("other_runs_leftovers", f"the leaving run failed: {handle.info}")]
    with tier.client("bob") as bob:
        handle = bob.run(
            write_project(
                work / "find",
                FIND_MAIN % {"secret": secret, "places": LEFTOVER_PLACES},
                name="find-files",
                outputs={"found": {"path": "found.json"}},
            )
        )
        if _finish(handle)["status"] != "done":
            return [Escape("other_runs_leftovers", f"the finding run failed: {handle.info}")]
        found = json.loads(handle.outputs("found", work / "found.json").read_text())["found"]
    escapes += [Escape("read_other_runs_leftover", path) for path in found]
    for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/run"):
        if not os.path.isdir(folder):
            continue
        for entry in os.listdir(folder):
            if secret in entry:
                escapes.append(Escape("leftover_on_host", os.path.join(folder, entry)))
                Path(folder, entry).unlink(missing_ok=True)
    return escapes


FORK_BOMB_MAIN = r"""
import json, os, sys, time
marker = sys.argv[1]
forked, error = 0, None
while forked < 4096:
    try:
        pid = os.fork()
    except OSError as exc:
        error = str(exc)
        break
    if pid == 0:
        os.execv("/bin/sleep", ["sleep", marker])
    forked += 1
json.dump({"forked": forked, "error": error}, open("fork.json", "w"))
"""


def case_fork_bomb(tier: Tier, work: Path) -> list[Escape]:
    """Fork until refused: the run's process limit must hold, and nothing may be left after it ends."""
    marker = str(1_000_000 + secrets.randbelow(10**6))
    with tier.client() as client:
        handle = client.run(
            write_project(
                work,
                FORK_BOMB_MAIN,
                name="fork-bomb",
                command=["python", "main.py", marker],
                outputs={"fork": {"path": "fork.json"}},
            )
        )
        final = _finish(handle)
        if final["status"] != "done":
            return [Escape("fork_bomb", f"the fork bomb did not finish: {final}")]
        result = json.loads(handle.outputs("fork", work / "fork.json").read_text())
        limit = handle.report()["limits"]["processes"]
    escapes = []
    OBSERVED[(tier.name, "fork_bomb")] = (
        f"forked {result['forked']} with a limit of {limit}, then: {result['error']}"
    )
    if result["forked"] > limit:
        escapes.append(Escape("fork_bomb", f"forked {result['forked']} processes past a limit of {limit}"))
    deadline = time.monotonic() + 10
    while processes_with(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    if processes_with(f"sleep {marker}"):
        escapes.append(
            Escape(
                "fork_bomb_leftovers", f"{len(processes_with(f'sleep {marker}'))} processes outlived the run"
            )
        )
    return escapes


MEMORY_MAIN = r"""
import os, sys, time
marker = sys.argv[1]
for _ in range(4):
    if os.fork() == 0:
        break
blocks = []
while True:
    blocks.append(b"\1" * (16 * 1024 * 1024))  # touched, so it is really resident
    time.sleep(0.01)
"""


@contextmanager
def sampled_memory(marker: str) -> Iterator[Callable[[], int]]:
    """The highest total memory of host processes whose command line holds `marker`, as their
    proportional set sizes (shared pages split between their users, so five Pythons are not counted
    five times for the one interpreter they share)."""
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            total = 0
            for pid in processes_with(marker):
                try:
                    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
                    total += int(rollup.split("\nPss:", 1)[1].split()[0]) * 1024
                except (OSError, ValueError, IndexError):
                    continue
            peak[0] = max(peak[0], total)
            time.sleep(0.01)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield lambda: peak[0]
    finally:
        done.set()
        thread.join()


def case_memory_fill(tier: Tier, work: Path) -> list[Escape]:
    """Five processes fill memory together (each alone stays under the limit only for a while)."""
    marker = f"memory-fill-{secrets.token_hex(4)}"
    with tier.client() as client, sampled_memory(marker) as peak:
        handle = client.run(
            write_project(
                work,
                MEMORY_MAIN,
                name="memory-fill",
                command=["python", "main.py", marker],
                timeout_seconds=60,
            )
        )
        final = _finish(handle)
        report = handle.report()
    escapes = []
    if final["status"] == "done" or final["failure_code"] not in ("workload_out_of_memory",):
        escapes.append(
            Escape(
                "memory_fill",
                f"the run was not stopped for memory: {final['status']} {final['failure_code']}"
                f" {final['failure_message']}",
            )
        )
    mechanism = report["isolation"].get("memory", "")
    OBSERVED[(tier.name, "memory_fill")] = (
        f"peak {peak() / MIB:.0f} MiB of {RUN_MEMORY_MIB} MiB ({mechanism})"
    )
    # A cgroup is a hard limit. A watched limit is not: it promises only that the run is stopped once its
    # total passes the limit (tested above); how far past depends on how fast it allocates.
    # The sampler's view and the cgroup's differ a little: file pages of the interpreter may be charged to
    # whoever read them first, outside the run's cgroup.
    allowance = RUN_MEMORY_MIB * MIB + 48 * MIB
    if mechanism != "watched" and peak() > allowance:
        escapes.append(
            Escape(
                "memory_fill",
                f"the host saw {peak() / MIB:.0f} MiB resident under a {mechanism or 'per-process'}"
                f" limit of {RUN_MEMORY_MIB} MiB",
            )
        )
    return escapes


DISK_MAIN = r"""
import os
block = os.urandom(1024 * 1024)
index = 0
while True:
    with open(f"fill-{index}.bin", "wb") as handle:
        for _ in range(8):
            handle.write(block)
    index += 1
"""


def _allocated(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total


def case_disk_fill(tier: Tier, work: Path) -> list[Escape]:
    """Write files until stopped: the work dir's quota must end the run, and the host must see it bounded."""
    with tier.client() as client:
        handle = client.run(write_project(work, DISK_MAIN, name="disk-fill", timeout_seconds=60))
        peak = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            info = client.get_run(handle.run_id)
            if info["status"] in ("done", "failed", "cancelled"):
                break
            peak = max(peak, _allocated(tier.workspace / handle.run_id))
            time.sleep(0.02)
        final = _finish(handle)
        mechanism = handle.report()["isolation"].get("disk", "")
    escapes = []
    if final["failure_code"] != "disk_quota_exceeded":
        escapes.append(
            Escape(
                "disk_fill",
                f"the run was not stopped by its quota: {final['status']} {final['failure_code']}",
            )
        )
    OBSERVED[(tier.name, "disk_fill")] = f"peak {peak / MIB:.0f} MiB of {RUN_DISK_MIB} MiB ({mechanism})"
    # A capped filesystem is a hard limit; a watched quota stops the run once passed (tested above).
    if mechanism == "capped" and peak > RUN_DISK_MIB * MIB:
        escapes.append(
            Escape("disk_fill", f"the work dir reached {peak / MIB:.0f} MiB past a capped {RUN_DISK_MIB} MiB")
        )
    return escapes


DAEMONS = """
    sleep {n} &
    (setsid sh -c 'sleep {n1}' &)
    (setsid python3 -c 'import os, time; os.fork() or time.sleep({n2})' &)
    echo daemons started
    wait
"""


def case_leftover_processes_after_cancel(tier: Tier, work: Path) -> list[Escape]:
    n = 1_000_000 + secrets.randbelow(10**6)
    with tier.client() as client:
        handle = client.run(
            write_project(work, "", name="daemons", command=DAEMONS.format(n=n, n1=n + 1, n2=n + 2))
        )
        wait_for_log(handle, "daemons started")
        deadline = time.monotonic() + 10
        while len(processes_with(f"sleep {n}")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        handle.cancel()
        final = _finish(handle)
    escapes = []
    if final["status"] != "cancelled":
        escapes.append(Escape("leftover_processes_after_cancel", f"the run ended {final['status']}"))
    left = processes_with(f"sleep {n}") + processes_with(f"time.sleep({n + 2})")
    if left:
        escapes.append(
            Escape("leftover_processes_after_cancel", f"{len(left)} process(es) outlived the cancel")
        )
    return escapes


CASES: dict[str, Callable[[Tier, Path], list[Escape]]] = {
    "filesystem_and_network": case_filesystem_and_network,
    "other_runs_leftovers": case_other_runs_leftovers,
    "fork_bomb": case_fork_bomb,
    "memory_fill": case_memory_fill,
    "disk_fill": case_disk_fill,
    "leftover_processes_after_cancel": case_leftover_processes_after_cancel,
}
# The backend's own process state a run could reach: keyring, /etc files, memfds, init's command line.
CASES.update(RESIDUE_CASES)


def scratch_dir() -> Path:
    """A folder both tiers' users may read (projects are read by the client, which is root here)."""
    return Path(tempfile.mkdtemp(prefix="cortex-escapes-"))


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
