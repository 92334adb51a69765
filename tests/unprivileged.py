"""A backend run as an ordinary user, as on a laptop (`Client.local()`), started from a root test.

The user gets a home of its own (with a .bashrc), a venv of its own made from Debian's
/usr/bin/python3.11 (the default python3 may live under /root, which others cannot enter) that reaches
this checkout's venv through a `.pth` line, and a data dir under its home. Everything is owned by that
user, so whatever the backend's user may write, a run could try to write too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .backend_process import BackendProcess, start_backend

# No account needs to exist for it: setpriv switches to the numbers.
UNPRIVILEGED_UID = 4242
SYSTEM_PYTHON = "/usr/bin/python3.11"
PROJECT = Path(__file__).resolve().parents[1]


def unavailable_reason() -> str | None:
    """Why this machine cannot start an unprivileged backend (None when it can)."""
    if os.geteuid() != 0:
        return "the tests are not running as root, so they cannot switch to another uid"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    if not os.path.exists(SYSTEM_PYTHON):
        return f"{SYSTEM_PYTHON} is not installed (an interpreter outside /root for the ordinary user)"
    site = sysconfig.get_paths()["purelib"]
    for path in (str(PROJECT), site):
        current = "/"
        for part in Path(path).parts[1:]:
            current = os.path.join(current, part)
            if not os.stat(current).st_mode & 0o001:
                return f"{current} is closed to other users, so an ordinary user cannot import this checkout"
    return None


def as_user(uid: int = UNPRIVILEGED_UID) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]


@dataclass
class UserHome:
    uid: int
    home: Path
    python: str

    @property
    def data_dir(self) -> Path:
        return self.home / ".local" / "share" / "cortex-nb" / "backend"

    @property
    def site_packages(self) -> Path:
        return Path(self.python).parent.parent / "lib" / "python3.11" / "site-packages"

    def env(self) -> dict[str, str]:
        env = {
            "HOME": str(self.home),
            "PATH": f"{Path(self.python).parent}:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "CORTEX_DISABLE_TELEMETRY": "1",
        }
        if (
            "PYTHONPATH" in os.environ
        ):  # a checkout other than the installed one (comparing against older code)
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return env

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*as_user(self.uid), *argv],
            env=self.env(),
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    def start_backend(self, *args: str) -> BackendProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for path in (
            self.home / ".local",
            self.home / ".local" / "share",
            self.data_dir.parent,
            self.data_dir,
        ):
            os.chown(path, self.uid, self.uid)
        return start_backend(
            self.data_dir, *args, python=self.python, prefix=as_user(self.uid), clean_env=self.env()
        )

    def create_token(self, name: str, *scopes: str) -> str:
        result = self.run(
            self.python,
            "-m",
            "cortex_backend",
            "token",
            "create",
            "--data-dir",
            str(self.data_dir),
            "--name",
            name,
            "--scopes",
            *scopes,
        )
        return result.stdout.strip()

    def remove(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)


def make_user_home(uid: int = UNPRIVILEGED_UID) -> UserHome:
    """A fresh home for `uid` with a .bashrc and a venv that sees this checkout's packages."""
    # Under /home, as a real user's: a run's private /tmp must not be what hides it.
    Path("/home").mkdir(exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="cortex-user-", dir="/home"))
    os.chmod(home, 0o700)
    (home / ".bashrc").write_text("# the user's own shell start-up file\n")
    for path in (home, home / ".bashrc"):
        os.chown(path, uid, uid)
    user = UserHome(uid, home, str(home / "venv" / "bin" / "python"))
    user.run(SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(home / "venv"))
    project_site = sysconfig.get_paths()["purelib"]
    pth = user.site_packages / "cortex-project.pth"
    pth.write_text(f"import site; site.addsitedir({project_site!r})\n")
    os.chown(pth, uid, uid)
    check = user.run(user.python, "-c", "import cortex_backend, cortex_nb, tornado; print('ok')", check=False)
    if check.returncode != 0:
        user.remove()
        raise RuntimeError(f"the user's venv cannot import the project: {check.stderr[-2000:]}")
    return user


def python_version_matches() -> bool:
    """The checkout's compiled packages (numpy, ...) must suit Debian's interpreter too."""
    return sys.version_info[:2] == (3, 11)
