"""What the repository tracks: nothing machine-local (a venv, a symlink to a developer's paths)
reaches a clone."""

from __future__ import annotations

import posixpath
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

README = ROOT / "README.md"
SYMLINK_MODE = "120000"
VENV_MARKERS = ("pyvenv.cfg", "site-packages")


def _git(*args: str) -> str:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing is tracked here")
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout


def outside_links(entries: list[tuple[str, str, str]], target_of: dict[str, str]) -> list[str]:
    """Tracked symlinks (`git ls-files -s` entries: mode, object, path) whose target is absolute
    or climbs out of the repository."""
    found = []
    for mode, obj, path in entries:
        if mode != SYMLINK_MODE:
            continue
        target = target_of[obj]
        joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if posixpath.isabs(target) or joined == ".." or joined.startswith("../"):
            found.append(f"{path} -> {target}")
    return found


def venv_paths(paths: list[str]) -> list[str]:
    """Tracked paths that belong to a virtual environment."""
    return [
        p
        for p in paths
        if any(part.startswith(".venv") or part == "venv" for part in p.split("/"))
        or posixpath.basename(p) in VENV_MARKERS
        or "/site-packages/" in f"/{p}"
    ]


def _tracked() -> list[tuple[str, str, str]]:
    entries = []
    for line in _git("ls-files", "-s", "-z").split("\0"):
        if line:
            meta, path = line.split("\t", 1)
            mode, obj, _stage = meta.split()
            entries.append((mode, obj, path))
    return entries


def test_no_tracked_symlink_points_outside_the_repository() -> None:
    entries = _tracked()
    links = {obj for mode, obj, _ in entries if mode == SYMLINK_MODE}
    targets = {obj: _git("cat-file", "blob", obj) for obj in links}
    assert outside_links(entries, targets) == []


def test_no_virtual_environment_is_tracked() -> None:
    assert venv_paths([path for _, _, path in _tracked()]) == []


def test_the_checks_catch_what_they_are_for() -> None:
    # the defect this guards against: a committed `.venv-main -> /work/main/.venv`
    entries = [
        (SYMLINK_MODE, "a", ".venv-main"),
        (SYMLINK_MODE, "b", "docs/up"),
        (SYMLINK_MODE, "c", "docs/inside"),
        ("100644", "d", "README.md"),
    ]
    targets = {"a": "/work/main/.venv", "b": "../../elsewhere", "c": "../README.md"}
    assert outside_links(entries, targets) == [
        ".venv-main -> /work/main/.venv",
        "docs/up -> ../../elsewhere",
    ]
    assert venv_paths([".venv-main", "env/lib/python3.11/site-packages/x.py", "venv/pyvenv.cfg",
                       "docs/venv.md", "README.md"]) == [
        ".venv-main",
        "env/lib/python3.11/site-packages/x.py",
        "venv/pyvenv.cfg",
    ]  # fmt: skip


@pytest.mark.parametrize("name", [".venv", ".venv-main", ".venv-torch2.14", "venv"])
def test_gitignore_keeps_venvs_and_links_to_them_out(name: str) -> None:
    # `--no-index`: judged by the patterns alone; a symlink is a file to git, so a pattern
    # with a trailing slash (`.venv/`) would not catch `.venv-main -> /elsewhere/.venv`
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--no-index", "-q", name], check=False
    )
    if proc.returncode == 128:
        pytest.skip("not a git checkout")
    assert proc.returncode == 0, f"{name} is not ignored by .gitignore"


def test_every_statement_of_the_python_version_agrees() -> None:
    """The toolkit needs 3.11 (datetime.UTC, hashlib.file_digest): pyproject, the linters, the
    action's installer and the README say the same."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.11"
    assert project["tool"]["ruff"]["target-version"] == "py311"
    assert project["tool"]["mypy"]["python_version"] == "3.11"
    installer = (ROOT / "scripts" / "install-toolkit.sh").read_text()
    assert "sys.version_info < (3, 11)" in installer and "Python >= 3.11" in installer
    readme = README.read_text()
    stated = set(re.findall(r"Python (\d\.\d+)\+?", readme))
    assert stated == {"3.11"}, stated


def test_the_readme_matrix_file_example_is_a_valid_matrix_file(tmp_path: Path) -> None:
    import re

    from ci_fxcache.verify import matrix

    blocks = re.findall(r"```yaml\n(# \.github/fxcache\.yml\n.*?)```", README.read_text(), re.S)
    assert len(blocks) == 1, "README lost its matrix-file example"
    path = tmp_path / "fxcache.yml"
    path.write_text(blocks[0])
    plan = matrix.build(dict.fromkeys(matrix.FLAGS), str(path))
    assert plan.workloads == ["myproject.compile_check:factory"]
    assert plan.dtypes == ["float32", "bfloat16"]
