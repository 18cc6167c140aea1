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


# Function size (issue 39): at most MAX_LONG functions over LONG lines, none over LONGEST.
LONG, LONGEST, MAX_LONG = 60, 80, 6


def _function_lengths() -> list[tuple[int, str]]:
    import ast

    found = []
    for path in sorted((ROOT / "ci_fxcache").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                size = node.end_lineno - node.lineno + 1
                found.append((size, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


def test_functions_stay_short() -> None:
    sizes = _function_lengths()
    assert len(sizes) > 500  # the walk sees the package's functions
    longest = [f"{where} ({size} lines)" for size, where in sizes if size > LONGEST]
    long = [f"{where} ({size} lines)" for size, where in sizes if size > LONG]
    assert longest == [], longest
    assert len(long) <= MAX_LONG, long
