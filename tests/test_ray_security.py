"""The Ray executor is no door into the backend's account: its Ray cluster takes no client without the
head's token, listens on loopback when the backend does, keeps its files in a dir only the backend's user
may enter, and a `host join` without the token is refused and never listed. A cluster of someone else's
that takes anyone is refused unless the operator says `--ray-insecure`, which the capacity reply shows.

Real processes throughout: the backend's own Ray head on loopback, hosts joined with `cortex-nb host
join`, attackers as plain Ray clients and a raw `ray start`. `python -m pytest -m ray` runs these too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from cortex_nb import Client

from .backend_process import start_backend
from .ray_cluster import RAY_ENV, START_TIMEOUT_S, start_ray_cluster
from .unprivileged import SYSTEM_PYTHON, as_user, unavailable_reason

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ATTACK_TIMEOUT_S = 240.0
# What an attacker on this machine runs: a Ray driver with no token (or a wrong one), and a task that
# would write a file as the backend's user.
ATTACKER_DRIVER = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
@ray.remote(num_cpus=0)
def plant(path):
    open(path, "w").write("written by a stranger's Ray task")
ray.get(plant.remote(sys.argv[2]), timeout=120)
print("TASK RAN")
"""


# Ray's own `ray start`, keeping a loopback head address as given (as the project's ray_cli.py does; an
# attacker can do the same), so a head that listens on loopback is reached there.
ATTACKER_RAY_START = """
from ray._private import services
swap = services.resolve_ip_for_localhost
services.resolve_ip_for_localhost = lambda host: host if services.is_localhost(host) else swap(host)
from ray.scripts.scripts import main
main()
"""


def attacker_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment with no Ray token in it (nor a ~/.ray/auth_token). Ray's single-machine switch lets
    the attacker's driver reach a head on loopback (Ray would look for 127.0.0.1 on the outward address)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_AUTH")}
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    return {**env, **RAY_ENV, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **extra}


def ray_processes(root_pids: list[int]) -> list[psutil.Process]:
    processes = []
    for pid in root_pids:
        try:
            root = psutil.Process(pid)
            processes += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return processes


def listening_addresses(processes: list[psutil.Process]) -> dict[str, set[str]]:
    """Each process's listening TCP addresses ("name pid" -> {"ip:port"})."""
    found: dict[str, set[str]] = {}
    for process in processes:
        try:
            sockets = process.net_connections(kind="inet")
            label = f"{process.name()} {process.pid}"
        except psutil.Error:
            continue
        for sock in sockets:
            if sock.status == psutil.CONN_LISTEN:
                found.setdefault(label, set()).add(f"{sock.laddr.ip}:{sock.laddr.port}")
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_ray_cluster(tmp_path_factory.mktemp("ray-secure"))
    try:
        yield cluster
    finally:
        cluster.stop()


def test_the_token_is_made_private_and_never_on_a_command_line(cluster):
    token_file = cluster.token_file
    info = token_file.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
    token = token_file.read_text().strip()
    assert len(token) >= 32
    for process in ray_processes([cluster.backend.process.pid]):
        try:
            assert token not in " ".join(process.cmdline()), (
                f"the token is on {process.name()}'s command line"
            )
        except psutil.Error:
            continue


def test_a_host_with_the_token_joins_and_is_listed(cluster):
    cluster.join("b", wait=True)
    assert cluster.host_names() == {"a", "b"}
    with cluster.client() as client:
        executor = client.get_capacity()["executor"]
    assert executor["name"] == "ray" and executor["ray_insecure"] is False
    assert executor["ray_address"].startswith("127.0.0.1:")


def test_ray_listens_on_loopback_only(cluster):
    """Every port of the head's and of a joined host's Ray processes (GCS, raylet, object manager,
    agents, workers) is bound to loopback, as the backend itself is (--host 127.0.0.1)."""
    if "b" not in cluster.hosts:
        cluster.join("b", wait=True)
    processes = ray_processes([cluster.backend.process.pid, cluster.hosts["b"].process.pid])
    names = {process.name() for process in processes if process.is_running()}
    assert {"gcs_server", "raylet"} <= names, names
    listening = listening_addresses(processes)
    assert any(label.startswith("gcs_server") for label in listening), listening
    exposed = {
        label: sorted(address for address in addresses if not is_loopback(address))
        for label, addresses in listening.items()
    }
    assert not any(exposed.values()), f"Ray ports open beyond loopback: {exposed}"


def test_ray_temp_dir_is_private(cluster):
    """Ray makes its temp dir and every dir in it 0777; the dir it is given lives in one only the
    backend's user may enter."""
    root = cluster.temp_dir
    info = root.stat()
    assert (
        stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == psutil.Process(cluster.backend.pid).uids().real
    )
    session = root / "ray" / "session_latest"
    assert (session / "sockets").is_dir(), sorted(os.listdir(root))
    # Another local user can neither plant a file in Ray's session nor reach its sockets.
    if unavailable_reason() is None:
        for target in (session / "planted", session / "sockets" / "planted"):
            attempt = subprocess.run(
                [
                    *as_user(),
                    SYSTEM_PYTHON,
                    "-c",
                    "import sys; open(sys.argv[1], 'w').write('x')",
                    str(target),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert attempt.returncode != 0 and "PermissionError" in attempt.stderr, attempt.stderr
            assert not target.exists()


def test_an_unauthenticated_ray_client_is_refused(cluster, tmp_path):
    """A Ray driver on this machine with no token, and one with a wrong token, cannot run a task."""
    planted = tmp_path / "planted"
    wrong = tmp_path / "wrong-token"
    wrong.write_text("0" * 64)
    wrong.chmod(0o600)
    for env in (
        attacker_env(tmp_path / "home", RAY_AUTH_MODE="disabled"),
        attacker_env(tmp_path / "home", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(wrong)),
    ):
        attack = subprocess.run(
            [sys.executable, "-c", ATTACKER_DRIVER, cluster.ray_address, str(planted)],
            capture_output=True,
            text=True,
            timeout=ATTACK_TIMEOUT_S,
            env=env,
        )
        output = attack.stdout + attack.stderr
        assert attack.returncode != 0 and "TASK RAN" not in output, output[-2000:]
        assert "AuthenticationError" in output or "InvalidAuthToken" in output, output[-2000:]
        assert not planted.exists()


def test_a_raw_ray_node_without_the_token_cannot_join(cluster, tmp_path):
    """Skipping `cortex-nb host join`: Ray's own `ray start --address` with no token never starts a node
    (an attacker's own `ray start`, which reaches a loopback head on loopback)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="crx", dir="/tmp"))
    try:
        attack = subprocess.Popen(
            [
                sys.executable,
                "-c",
                ATTACKER_RAY_START,
                "start",
                "--address",
                cluster.ray_address,
                "--num-cpus",
                "1",
                "--resources",
                '{"cortex-host:evil": 1, "cortex-model:tiny": 1000}',
                "--temp-dir",
                str(temp_dir / "ray"),
                "--object-store-memory",
                "100000000",
                "--disable-usage-stats",
                "--block",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=attacker_env(
                tmp_path / "home", RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1"
            ),
            start_new_session=True,
        )
        try:
            output, _ = attack.communicate(timeout=ATTACK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(attack.pid, signal.SIGKILL)
            output, _ = attack.communicate()
            pytest.fail(f"`ray start` without a token was still running:\n{output[-2000:]}")
        assert attack.returncode != 0 and "Ray runtime started" not in output, output[-2000:]
        assert "AuthenticationError" in output or "InvalidAuthToken" in output, output[-2000:]
        assert "evil" not in cluster.host_names()
    finally:
        try:
            os.killpg(attack.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.parametrize("token", ["none", "wrong"])
def test_host_join_without_the_token_is_refused_and_not_listed(cluster, tmp_path, token):
    token_file = None
    if token == "wrong":
        token_file = tmp_path / "wrong-token"
        token_file.write_text("f" * 64)
        token_file.chmod(0o600)
    host = cluster.join(f"intruder-{token}", wait=False, token_file=token_file)
    code = host.process.wait(timeout=ATTACK_TIMEOUT_S)
    output = host.log_path.read_text()
    assert code == 2, output[-2000:]
    if token == "none":
        assert "joining needs the head's Ray token" in output, output[-2000:]
    else:
        assert "refused this host's token" in output, output[-2000:]
    assert "Ray runtime started" not in output
    assert not any(name.startswith("intruder") for name in cluster.host_names())


def test_host_join_refuses_a_token_file_others_can_read(cluster, tmp_path):
    exposed = tmp_path / "exposed-token"
    shutil.copy(cluster.token_file, exposed)
    exposed.chmod(0o644)
    host = cluster.join("careless", wait=False, token_file=exposed)
    assert host.process.wait(timeout=ATTACK_TIMEOUT_S) == 2
    assert "chmod 600" in host.log_path.read_text()
    assert "careless" not in cluster.host_names()


# a cluster of someone else's ---------------------------------------------------------------------
def test_a_cluster_that_asks_for_a_token_is_used_only_with_it(cluster, tmp_path):
    """`--ray-address` to a cluster with token authentication (here the first backend's): refused without
    its token file, used with it (and not reported insecure)."""
    arguments = ["--executor", "ray", "--ray-address", cluster.ray_address, "--devices", "none"]
    refused = subprocess.run(
        [sys.executable, "-m", "cortex_backend", "serve", "--data-dir", str(tmp_path / "a"), "--port", "0"]
        + arguments,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env={**os.environ, **RAY_ENV},
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert f"cannot read the Ray token file {tmp_path / 'a' / 'ray-auth-token'}" in refused.stderr
    backend = start_backend(
        tmp_path / "b",
        *arguments,
        "--ray-token-file",
        str(cluster.token_file),
        timeout_s=START_TIMEOUT_S,
        env=RAY_ENV,
    )
    try:
        with Client(backend.url, backend.token) as client:
            executor = client.get_capacity()["executor"]
        assert executor["ray_insecure"] is False and executor["ray_address"] == cluster.ray_address
    finally:
        backend.stop(timeout_s=60.0)


@pytest.fixture(scope="module")
def open_cluster(tmp_path_factory):
    """A Ray head on loopback without token authentication, as someone else might run one (Ray's
    `ray start --head` with RAY_AUTH_MODE=disabled, started the way the backend starts its own)."""
    from cortex_backend.executors.ray_cluster.cluster_token import disabled_environment
    from cortex_backend.executors.ray_cluster.head import RayHead

    temp_dir = Path(tempfile.mkdtemp(prefix="cro", dir="/tmp"))
    node = {"num_cpus": 0, "num_gpus": 0, "resources": {}}
    log_path = tmp_path_factory.mktemp("open-head") / "ray-head.log"
    head = asyncio.run(
        RayHead.start(node, 0, 100_000_000, temp_dir / "ray", log_path, "127.0.0.1", disabled_environment())
    )
    try:
        yield head.address
    finally:
        head.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_cluster_without_authentication_is_refused_unless_insecure(open_cluster, tmp_path):
    arguments = ["--executor", "ray", "--ray-address", open_cluster, "--devices", "none"]
    refused = subprocess.run(
        [sys.executable, "-m", "cortex_backend", "serve", "--data-dir", str(tmp_path / "a"), "--port", "0"]
        + arguments,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env={**os.environ, **RAY_ENV},
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "runs without token authentication" in refused.stderr and "--ray-insecure" in refused.stderr
    backend = start_backend(
        tmp_path / "b", *arguments, "--ray-insecure", timeout_s=START_TIMEOUT_S, env=RAY_ENV
    )
    try:
        with Client(backend.url, backend.token) as client:
            executor = client.get_capacity()["executor"]
        assert executor["ray_insecure"] is True and executor["ray_address"] == open_cluster
        assert "--ray-insecure" in backend.log()
    finally:
        backend.stop(timeout_s=60.0)
