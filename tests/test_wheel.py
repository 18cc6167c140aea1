"""Issue 49 item 3: a wheel that works on its own. `python -m build` makes an sdist and, from
it, a wheel; the wheel goes into a clean environment (no editable install, no source tree on
any path) and the main job runs from a directory outside the source tree: fingerprint,
restore, verify one combination, save, report. A snippet, template or schema missing from the
package data fails here, as it would for a user."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from ci_fxcache import __version__
from tests.conftest import ROOT, TORCH_PYTHON

pytestmark = pytest.mark.slow
# What a build needs of the tree (sources, metadata, README for the long description, the
# licence); a copy, so a build never writes into the working tree (egg-info, build/) under
# other tests.
SOURCES = ("ci_fxcache", "pyproject.toml", "README.md", "LICENSE")
ONE_COMBINATION = ("--workloads", "sin_matmul", "--device", "cpu", "--dtypes", "float32",
                   "--dynamic", "false", "--mechanisms", "fxgraph",
                   "--training", "false")  # fmt: skip


def _package_files() -> set[str]:
    """Every file of the package in the tree, as a wheel names it (bytecode aside)."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "ci_fxcache").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel `python -m build` makes (the wheel is built from the sdist)."""
    tree = tmp_path_factory.mktemp("tree")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tree / name, ignore=ignore)
        else:
            shutil.copy2(src, tree / name)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(tree)],
                          capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_the_sdist_and_the_wheel_hold_every_file_of_the_package(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    assert wheel.name == f"ci_fxcache-{__version__}-py3-none-any.whl"
    assert sdist.name == f"ci_fxcache-{__version__}.tar.gz"
    wanted = _package_files()
    assert {"ci_fxcache/results/results.schema.json", "ci_fxcache/py.typed"} <= wanted
    with zipfile.ZipFile(wheel) as zf:
        in_wheel = {n for n in zf.namelist() if n.startswith("ci_fxcache/")}
        metadata = zf.read(f"ci_fxcache-{__version__}.dist-info/METADATA").decode()
        licence = zf.read(f"ci_fxcache-{__version__}.dist-info/licenses/LICENSE").decode()
    assert "Apache License" in licence and "Version 2.0" in licence
    assert in_wheel == wanted, (wanted - in_wheel, in_wheel - wanted)
    with tarfile.open(sdist) as tf:
        top = f"ci_fxcache-{__version__}/"
        in_sdist = {n.removeprefix(top) for n in tf.getnames()}
    assert wanted <= in_sdist, wanted - in_sdist
    assert {"pyproject.toml", "README.md", "PKG-INFO", "LICENSE"} <= in_sdist
    assert f"\nVersion: {__version__}\n" in metadata
    assert "\nRequires-Dist: jinja2>=3.1\n" in metadata
    assert {"License-Expression: Apache-2.0", "License-File: LICENSE"} <= set(metadata.split("\n"))


def _exports(stdout: str) -> dict[str, str]:
    """`restore`'s `export NAME=value` lines, as `eval` would apply them."""
    env = {}
    for line in stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0]
    return env


def test_the_installed_wheel_runs_the_main_job_outside_the_source_tree(
    dist: Path, tmp_path: Path
) -> None:
    env_dir = tmp_path / "toolkit"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    (wheel,) = dist.glob("*.whl")
    pip = subprocess.run([str(env_dir / "bin/python"), "-m", "pip", "install", "-q", str(wheel)],
                         capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-3000:]
    job = tmp_path / "job"  # the user's checkout: no fxcache sources anywhere near
    job.mkdir()
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("GITHUB_", "FXCACHE_", "PYTHON", "TORCH"))}  # fmt: skip
    base.update(FXCACHE_ROOT=str(tmp_path / "store"), TMPDIR=str(tmp_path),
                TORCHINDUCTOR_COMPILE_THREADS="1")  # fmt: skip

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(env_dir / "bin/fxcache"), *args], cwd=job,
                              env={**base, **(env or {})}, capture_output=True, text=True,
                              timeout=900, check=False)  # fmt: skip

    code = "import ci_fxcache; print(ci_fxcache.__file__)"
    where = subprocess.run([str(env_dir / "bin/python"), "-c", code], cwd=job, env=base,
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout
    assert run("--version").stdout.strip() == f"fxcache {__version__}"

    fingerprint = run("fingerprint", "--json", "--python", TORCH_PYTHON)
    assert fingerprint.returncode == 0, fingerprint.stderr
    restored = run("restore", "--python", TORCH_PYTHON)
    assert restored.returncode == 0, restored.stderr
    exports = _exports(restored.stdout)
    results = job / "results.json"
    verified = run("verify", "--python", TORCH_PYTHON, *ONE_COMBINATION, "--json", str(results),
                   env=exports)  # fmt: skip
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    doc = json.loads(results.read_text())
    (combo,) = doc["combos"]
    assert combo["verdict"] == "safe", combo["reason"]
    assert doc["fxcache_version"] == __version__
    saved = run("save", "--json", env=exports)
    assert saved.returncode == 0 and json.loads(saved.stdout)["saved"], saved.stderr
    markdown = run("report", str(results), "--format", "md", env=exports)  # the jinja2 template
    assert markdown.returncode == 0 and "### fxcache: ✅ 1/1 safe" in markdown.stdout, markdown
    junit = run("report", str(results), "--format", "junit", env=exports)
    assert junit.returncode == 0 and "<testsuite" in junit.stdout, junit.stderr
    assert not (job / "ci_fxcache").exists()
