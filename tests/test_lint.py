"""Static checks inside the suite: ruff and mypy on the package, hadolint on the Dockerfile."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    assert found, f"{name} is not installed: run the README's test set-up command"
    return found


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_check() -> None:
    proc = _run(_tool("ruff"), "check", "ci_fxcache", "tests", "benchmarks")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy() -> None:
    proc = _run(_tool("mypy"), "ci_fxcache")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_dockerfile() -> None:
    proc = _run(_tool("hadolint"), "Dockerfile")
    assert proc.returncode == 0, proc.stdout + proc.stderr
