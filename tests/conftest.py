"""Shared fixtures: the real `fxcache` CLI in a subprocess; interpreters with/without torch."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import venv
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from ci_fxcache.env.interpreter import run_snippet
from tests import cxx_cache

ROOT = Path(__file__).resolve().parents[1]
# The interpreter running the tests has the pinned torch==2.13.0: it is the "user's" Python.
TORCH_PYTHON = sys.executable
# The second real torch, the newest tested (a CUDA build that compiles on the CPU): the README's
# test command builds it in .venv-torch2.15; FXCACHE_TEST_TORCH2_PYTHON points at another copy.
TORCH2_VERSION = "2.15.0"
TORCH2_VENV = ROOT / ".venv-torch2.15"


@dataclass(frozen=True)
class TorchBuild:
    """What the test interpreter's torch is, as the fingerprint reads it (no `import torch`)."""

    version: str  # torch.__version__: "2.13.0+cpu", "2.13.0+cu130", ...
    cuda: str | None  # torch.version.cuda: None for a CPU build
    triton: str | None  # the installed Triton's version: None without Triton


def load_script(path: Path, name: str) -> ModuleType:
    """A repository script (not a package module) imported as module `name`, to test its
    functions."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def torch_build() -> TorchBuild:
    """The pinned torch==2.13.0 the tests run with, in whichever build pip brought: the CPU
    build from a CPU index (`2.13.0+cpu`), the CUDA build from the default index (`+cu130`,
    with Triton). Tests take versions and flavours from here, never assume the CPU build."""
    report = run_snippet(TORCH_PYTHON, "read_versions")
    versions = report["torch_version_py"]
    return TorchBuild(str(versions["__version__"]), versions.get("cuda"), report["triton_version"])


@functools.cache
def _torch_version_of(python: str) -> str:
    """The torch version `python` has, read from its metadata (no `import torch`)."""
    proc = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.stdout.strip() or f"none ({proc.stderr.strip()[-200:]})"


def torch2_python() -> str:
    """The interpreter with torch==2.15.0; fails the test when it was not built (or has
    another torch: an older FXCACHE_TEST_TORCH2_PYTHON would test the wrong release)."""
    python = os.environ.get("FXCACHE_TEST_TORCH2_PYTHON") or str(TORCH2_VENV / "bin" / "python")
    if not Path(python).exists():
        pytest.fail(
            f"no torch=={TORCH2_VERSION} interpreter at {python}: run the README's test set-up "
            "command (it builds .venv-torch2.15), or set FXCACHE_TEST_TORCH2_PYTHON"
        )
    found = _torch_version_of(python)
    if found.split("+")[0] != TORCH2_VERSION:
        pytest.fail(
            f"{python} has torch {found}, not {TORCH2_VERSION}: point FXCACHE_TEST_TORCH2_PYTHON "
            "at a torch 2.15.0 interpreter (the README's test command builds .venv-torch2.15)"
        )
    return python


_CXX_CACHE = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """The controller (not each xdist worker) puts tests/cxx_cache.py's `g++` first on PATH, so
    every process the tests start shares one compiler-output cache; FXCACHE_TEST_CXX_CACHE=0
    compiles everything for real."""
    if hasattr(config, "workerinput") or os.environ.get("FXCACHE_TEST_CXX_CACHE") == "0":
        return
    compiler = cxx_cache.real_compiler()
    if compiler is None:
        return
    base = Path(tempfile.mkdtemp(prefix="fxcache-test-cxx-"))
    config.stash[_CXX_CACHE] = base
    bin_dir = cxx_cache.install(base, compiler, sys.executable)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def pytest_unconfigure(config: pytest.Config) -> None:
    base = config.stash.get(_CXX_CACHE, None)
    if base is not None:
        shutil.rmtree(base, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with `slow` tests (real compiles) run first, each module's tests in their order,
    so they never wait for the end of the run with one worker compiling alone (see addopts'
    --dist worksteal in pyproject.toml: compiles beside unit tests, then stealing balances)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(scope="module", params=["2.13.0", TORCH2_VERSION])
def torch_python(request: pytest.FixtureRequest) -> str:
    """Each real torch the main verification tests run against: 2.13.0 and 2.15.0."""
    return TORCH_PYTHON if request.param == "2.13.0" else torch2_python()


RunFxcache = Callable[..., subprocess.CompletedProcess[str]]


def _clean_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra or {})
    return env


def lease_holders_under(base: Path) -> list[int]:
    """Pids of fxcache lease holders (store/scopes.py) whose lease lies under `base`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if b"ci_fxcache" not in (proc / "cmdline").read_bytes():
                continue
            targets = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:  # gone, or not ours to read
            continue
        if any(t.startswith(f"{base}/") and "/.leases/" in t for t in targets):
            found.append(int(proc.name))
    return found


@pytest.fixture(scope="session", autouse=True)
def _lease_holders_end_with_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A restore that a test runs as an Actions job (GITHUB_ACTIONS set, no Runner.Worker
    above it) has no job process for its lease holder to watch, so the holder would sleep for
    the lease TTL (6 h) after the suite, as it would until a container job's end. End them."""
    yield
    for pid in lease_holders_under(tmp_path_factory.getbasetemp()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


@pytest.fixture
def run_fxcache() -> RunFxcache:
    """Run `python -m ci_fxcache ARGS` with a clean environment (no GITHUB_*/FXCACHE_* leaks)."""

    def run(
        *args: str, env: dict[str, str] | None = None, timeout: float = 120, **kw: object
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ci_fxcache", *args],
            capture_output=True,
            text=True,
            env=_clean_env(env),
            timeout=timeout,
            check=False,
            **kw,  # type: ignore[arg-type]
        )

    return run


@pytest.fixture(scope="session")
def python_without_torch(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real interpreter (a fresh venv) that has no torch."""
    target = tmp_path_factory.mktemp("notorch")
    venv.EnvBuilder(with_pip=False).create(target)
    return str(target / "bin" / "python")


@pytest.fixture
def fake_tools(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write executable stand-ins for vendor tools (nvidia-smi, rocminfo) into a PATH dir."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()

    def make(name: str, script: str) -> Path:
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
        return bin_dir

    return make


def free_port() -> int:
    """A free TCP port on loopback."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> object:
    """A real redis-server on a free loopback port for the whole session (no persistence)."""
    import shutil
    import time

    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed: run the README's test set-up command")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import socket

    deadline = time.monotonic() + 15
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"redis-server did not start on port {port}")
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def fake_github() -> object:
    """A strict local GitHub REST stand-in; fails the test if any request broke the API rules."""
    from tests.fake_github import FakeGitHub

    with FakeGitHub() as server:
        yield server
    assert server.violations == [], server.violations


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> object:
    """A real SeaweedFS S3 server on free loopback ports for the whole session."""
    from tests import s3_server

    server = s3_server.start(tmp_path_factory.mktemp("seaweed"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nonroot() -> Iterator[object]:
    """An unprivileged user (`nobody` when the suite runs as root) with an interpreter that has
    torch, for the store, verify and action scenarios that must also run as runners run
    (tests/nonroot.py)."""
    from tests.nonroot import nonroot_user

    with nonroot_user() as user:
        yield user
