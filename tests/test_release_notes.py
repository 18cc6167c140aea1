"""The release workflow's notes: a version's section of a Keep a Changelog file
(.github/scripts/release_notes.py), on a sample changelog."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT, load_script

SCRIPT = ROOT / ".github/scripts/release_notes.py"
SAMPLE = """# Changelog

All notable changes to this project are documented in this file.

## [Unreleased]

### Added
- Something not released yet.

## [1.1.0] - 2027-02-01

### Fixed
- A fix.

## [1.0.0] - 2026-12-06

### Added
- The action, `@v1`.
- The toolkit, `fxcache`.

[Unreleased]: https://example.invalid/compare/v1.1.0...HEAD
[1.1.0]: https://example.invalid/compare/v1.0.0...v1.1.0
[1.0.0]: https://example.invalid/releases/tag/v1.0.0
"""


def _module() -> ModuleType:
    return load_script(SCRIPT, "release_notes")


def test_a_versions_section_up_to_the_next_heading() -> None:
    notes = _module().section(SAMPLE, "v1.0.0")
    assert notes == "### Added\n- The action, `@v1`.\n- The toolkit, `fxcache`."
    assert _module().section(SAMPLE, "1.1.0") == "### Fixed\n- A fix."


@pytest.mark.parametrize(
    ("text", "version", "words"),
    [(SAMPLE, "1.0.1", "no notes for version 1.0.1"),
     (SAMPLE.replace("## [1.1.0] - 2027-02-01", "## [1.1.0]"), "1.1.0", "no release date"),
     (SAMPLE.replace("### Fixed\n- A fix.\n", ""), "1.1.0", "no notes for version 1.1.0"),
     (SAMPLE, "1.0", "no notes for version 1.0")],
)  # fmt: skip
def test_no_notes_is_an_error(text: str, version: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        _module().section(text, version)


def test_the_script_prints_the_notes_or_one_line_and_exit_2(tmp_path: Path) -> None:
    changelog = tmp_path / "CHANGELOG.md"
    changelog.write_text(SAMPLE)
    ok = subprocess.run([sys.executable, str(SCRIPT), "v1.1.0", str(changelog)],
                        capture_output=True, text=True, check=False)  # fmt: skip
    assert (ok.returncode, ok.stdout) == (0, "### Fixed\n- A fix.\n")
    bad = subprocess.run([sys.executable, str(SCRIPT), "v9.9.9", str(changelog)],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "release notes: CHANGELOG.md has no notes for version 9.9.9\n"


def test_the_release_workflow_tests_builds_notes_releases_and_moves_the_major_tag() -> None:
    import yaml

    path = ROOT / ".github/workflows/release.yml"
    doc = yaml.safe_load(path.read_text())
    assert doc[True]["push"] == {"tags": ["v[0-9]+.[0-9]+.[0-9]+"]}  # YAML 1.1 reads `on` as True
    jobs = doc["jobs"]
    assert jobs["tests"]["uses"] == "./.github/workflows/tests.yml"
    assert jobs["build"]["needs"] == "tests" and jobs["release"]["needs"] == "build"
    build = "\n".join(s.get("run", "") for s in jobs["build"]["steps"])
    assert "python -m build" in build and "python3 .github/scripts/release_notes.py" in build
    release = "\n".join(s.get("run", "") for s in jobs["release"]["steps"])
    assert "gh release create" in release and 'major="${TAG%%.*}"' in release
    assert [j["permissions"] for j in jobs.values()].count({"contents": "write"}) == 1
