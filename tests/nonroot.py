"""Run test scenarios as an unprivileged user, as self-hosted runners run (root ignores modes).

Used through the `nonroot` fixture (conftest.py). When the suite runs as root (CI, this
machine), commands run as `nobody` through `setpriv`, with an interpreter that user can
execute: a venv made from a base interpreter it can run, whose site-packages are the test
interpreter's (torch 2.13.0, the editable toolkit). When the checkout or the interpreter is
not readable by other users (a clone under /root), the user gets CAP_DAC_READ_SEARCH, which
lets it read and traverse anything but writes nothing more: file modes still refuse every
write, which is what the store's read-only files are about (`reads_bypassed` says so; tests
of read denials skip then, saying why). When the suite runs as an ordinary user, commands run
as that user.
"""

from __future__ import annotations

import ast
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

NOBODY_UID = 65534
NOBODY_GID = 65534
_READ_ANYTHING = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]


def _as_user(uid: int, read_anything: bool = False) -> list[str]:
    """The command prefix that runs as `uid` (group nogroup, no other groups). `env` execs the
    command after setpriv changed user: setpriv itself starts a program the user could not
    reach (measured: an interpreter under /root ran, and only failed later)."""
    caps = _READ_ANYTHING if read_anything else []
    return ["setpriv", f"--reuid={uid}", f"--regid={NOBODY_GID}", "--clear-groups", *caps, "env"]


_SETPRIV = _as_user(NOBODY_UID)
_PROBE = "import torch, ci_fxcache, tests.store_job; print(torch.__version__)"


@dataclass
class NonRoot:
    """An unprivileged user: `python` it can execute, `home` it owns, `run` as it."""

    base: Path  # world-traversable directory holding everything below
    python: str
    home: Path
    uid: int
    prefix: list[str]  # setpriv ... (empty when the suite already runs unprivileged)
    reads_bypassed: bool

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A clean environment for the user: its own HOME and TMPDIR, no GITHUB_*/FXCACHE_*."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GITHUB_", "FXCACHE_", "TORCHINDUCTOR_", "TRITON_"))
        }
        env.update(HOME=str(self.home), TMPDIR=str(self.home), PYTHONDONTWRITEBYTECODE="1")
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
        env.update(extra or {})
        return env

    def run(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 900,
        umask: int | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` as the user (python = the user's interpreter when argv[0] is "python")."""
        args = [self.python if a == "python" else a for a in argv]
        if umask is not None:
            args = ["sh", "-c", f'umask {umask:03o} && exec "$@"', "sh", *args]
        return subprocess.run(
            [*self.prefix, *args],
            capture_output=True,
            text=True,
            env=self.env(env),
            cwd=str(cwd or self.home),
            timeout=timeout,
            check=False,
        )

    def mkdir(self, name: str, mode: int = 0o755) -> Path:
        """A fresh directory under `base` owned by the user."""
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.base))
        path.chmod(mode)
        if self.prefix:
            os.chown(path, self.uid, NOBODY_GID)
        return path

    def other_user(self) -> NonRoot:
        """A second unprivileged user in the same group (uid 65533, gid nogroup): another
        runner user of a group-shared store. Skips when the suite is not run by root."""
        if not self.prefix:
            import pytest

            pytest.skip("a second user needs the suite to run as root")
        uid = NOBODY_UID - 1
        home = self.base / f"home-{uid}"
        home.mkdir(mode=0o755, exist_ok=True)
        os.chown(home, uid, NOBODY_GID)
        prefix = _as_user(uid, self.reads_bypassed)
        return NonRoot(self.base, self.python, home, uid, prefix, self.reads_bypassed)

    def fxcache(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """`python -m ci_fxcache ARGS` as the user."""
        return self.run(["python", "-m", "ci_fxcache", *args], **kw)  # type: ignore[arg-type]


def pip_env() -> dict[str, str]:
    """The suite's pip configuration (its user's and site files, e.g. a local index under
    /root/.config/pip) as PIP_* variables: pip run by the unprivileged user (the action's
    toolkit install) then finds what the suite's own pip finds. Global options only."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    env = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("global."):
            name = "PIP_" + key.removeprefix("global.").upper().replace("-", "_")
            env[name] = str(ast.literal_eval(value))
    return env


def _candidates() -> list[str]:
    major, minor = sys.version_info[:2]
    found = [
        os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
        f"/usr/bin/python{major}.{minor}",
        f"/usr/local/bin/python{major}.{minor}",
    ]
    return [c for i, c in enumerate(found) if c not in found[:i] and os.path.exists(c)]


def _runs(prefix: list[str], python: str, code: str, cwd: Path) -> bool:
    proc = subprocess.run(
        [*prefix, python, "-c", code],
        capture_output=True,
        text=True,
        cwd=str(cwd),
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd)},
        check=False,
        timeout=300,
    )
    return proc.returncode == 0


def _make_venv(base: Path, prefix: list[str]) -> str | None:
    """A venv (no pip) from a base interpreter the user can run, seeing the test
    interpreter's site-packages; its python, or None when no candidate runs for the user."""
    version = f"import sys; assert sys.version_info[:2] == {tuple(sys.version_info[:2])}"
    for i, base_python in enumerate(_candidates()):
        if not _runs(prefix, base_python, version, base):
            continue
        target = base / f"venv{i}"
        subprocess.run([base_python, "-m", "venv", "--without-pip", str(target)], check=True)
        dirs = [p for p in site.getsitepackages() if os.path.isdir(p)]
        purelib = Path(
            subprocess.check_output(
                [str(target / "bin" / "python"), "-c",
                 "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                text=True,
            ).strip()
        )  # fmt: skip
        lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs)
        (purelib / "fxcache-tests.pth").write_text(lines, encoding="utf-8")
        subprocess.run(["chmod", "-R", "a+rX", str(target)], check=True)
        return str(target / "bin" / "python")
    return None


@contextmanager
def nonroot_user() -> Iterator[NonRoot]:
    """The unprivileged user for this session (see the module docstring); cleaned up after."""
    base = Path(tempfile.mkdtemp(prefix="fxcache-nonroot-"))
    try:
        base.chmod(0o755)
        repo = Path(__file__).resolve().parents[1]
        if os.geteuid() != 0:
            home = base / "home"
            home.mkdir()
            yield NonRoot(base, sys.executable, home, os.geteuid(), [], False)
            return
        if shutil.which("setpriv") is None:
            raise RuntimeError("setpriv (util-linux) is needed to run tests as a non-root user")
        home = base / "home"
        home.mkdir(mode=0o755)
        os.chown(home, NOBODY_UID, NOBODY_GID)
        probe = f"import sys; sys.path.insert(0, {str(repo)!r}); {_PROBE}"
        python = _make_venv(base, _SETPRIV)
        if python is not None and _runs(_SETPRIV, python, probe, home):
            yield NonRoot(base, python, home, NOBODY_UID, list(_SETPRIV), False)
            return
        prefix = _as_user(NOBODY_UID, read_anything=True)
        python = python or sys.executable
        if not _runs(prefix, python, probe, home):
            raise RuntimeError(f"no interpreter with torch that uid {NOBODY_UID} can run")
        yield NonRoot(base, python, home, NOBODY_UID, prefix, True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
