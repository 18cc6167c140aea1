"""Issue 49: a release users can pin. The version has one home and a CHANGELOG entry in the Keep
a Changelog form (the release workflow takes its notes from it); the README shows `@v1`."""

from __future__ import annotations

import datetime
import re
import tomllib

import pytest
import yaml

import ci_fxcache
from tests.conftest import ROOT

SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
RELEASE = re.compile(r"^## \[(?P<version>[^\]]+)\] - (?P<date>\d{4}-\d{2}-\d{2})$")


def releases(changelog: str) -> list[tuple[str, str]]:
    """(version, date) of each `## [X.Y.Z] - YYYY-MM-DD` heading, in the file's order; a second
    level heading of any other shape but `## [Unreleased]` fails."""
    found = []
    for line in changelog.splitlines():
        if line.startswith("## ") and line != "## [Unreleased]":
            match = RELEASE.match(line)
            assert match and SEMVER.fullmatch(match["version"]), f"not a release heading: {line}"
            found.append((match["version"], match["date"]))
    return found


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_the_version_has_one_home_and_is_semantic() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ci_fxcache.__version__"}
    assert SEMVER.fullmatch(ci_fxcache.__version__), ci_fxcache.__version__


def test_the_changelog_has_an_entry_for_the_packages_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## .*$", text, re.M)
    assert headings[0] == "## [Unreleased]", headings  # what is merged and not yet released
    found = releases(text)
    assert ci_fxcache.__version__ in [v for v, _ in found], "no CHANGELOG entry for this version"
    assert [v for v, _ in found] == sorted((v for v, _ in found), key=_key, reverse=True)
    for version, date in found:
        datetime.date.fromisoformat(date)
        assert f"\n[{version}]: " in text, f"no link for [{version}]"
        section = text.split(f"## [{version}] - {date}", 1)[1].split("\n## ", 1)[0]
        assert re.search(r"^### (Added|Changed|Deprecated|Removed|Fixed|Security)$", section, re.M)


@pytest.mark.parametrize(
    "heading",
    ["## [1.0] - 2026-12-06", "## 1.0.0 - 2026-12-06", "## [1.0.0] 2026-12-06", "## Notes"],
)
def test_a_heading_out_of_the_form_is_refused(heading: str) -> None:
    with pytest.raises(AssertionError, match="not a release heading"):
        releases(f"# Changelog\n\n## [Unreleased]\n\n{heading}\n")


def _uses(text: str) -> list[str]:
    """Every `uses:` of the fxcache action in the YAML blocks of a markdown page."""
    found = []
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        found += re.findall(r"uses: (\S*fxcache-action\S*)", block)
    return found


@pytest.mark.parametrize("page", ["README.md", "docs/action.md", "docs/store.md"])
def test_the_examples_take_the_major_tag(page: str) -> None:
    uses = _uses((ROOT / page).read_text(encoding="utf-8"))
    assert uses and all(
        re.fullmatch(r"fxcache/fxcache-action(/(save|invalidate|toolkit))?@v1", u) for u in uses
    ), uses
    for block in re.findall(r"```yaml\n(.*?)```", (ROOT / page).read_text(), re.S):
        yaml.safe_load(block)  # each example still parses


REPOSITORY = "https://github.com/fxcache/fxcache-action"  # the name README's `uses:` lines give


def _slugs(path: str) -> set[str]:
    text = (ROOT / path).read_text(encoding="utf-8")
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}  # fmt: skip


@pytest.mark.parametrize("page", ["SECURITY.md", "CONTRIBUTING.md", "CHANGELOG.md"])
def test_the_project_files_link_only_to_what_exists(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s:]+)(?:#([\w-]+))?\)", text)
    assert links, page
    for target, anchor in links:
        assert (ROOT / target).exists(), (page, target)
        if anchor:
            assert anchor in _slugs(target), (page, target, anchor)


def test_security_policy_says_how_to_report_what_is_in_scope_and_the_model() -> None:
    text = (ROOT / "SECURITY.md").read_text(encoding="utf-8")
    for heading in ("## Reporting a vulnerability", "## In scope", "## Out of scope",
                    "## The threat model in short"):  # fmt: skip
        assert f"\n{heading}\n" in text, heading
    assert "Report a\nvulnerability" in text and "not in a public issue" in text
    assert "(docs/security.md)" in text


def test_contributing_holds_the_development_guide_and_the_readme_points_there() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert "(CONTRIBUTING.md)" in readme and "(SECURITY.md)" in readme
    assert "Where a change goes" in contributing and "Where a change goes" not in readme
    assert "tests/test_layers.py" in contributing and "## [Unreleased]" in contributing


def test_the_package_metadata_names_the_repository_and_what_it_runs_on() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    urls = project["urls"]
    assert {"Homepage", "Changelog", "Issues", "Security"} <= set(urls)
    assert all(url.startswith(REPOSITORY) for url in urls.values()), urls
    assert f"{REPOSITORY}@v1" in (ROOT / "README.md").read_text()  # `pipx run --spec git+...`
    classifiers = project["classifiers"]
    oldest = project["requires-python"].removeprefix(">=")
    assert f"Programming Language :: Python :: {oldest}" in classifiers
    assert ("Typing :: Typed" in classifiers) == (ROOT / "ci_fxcache" / "py.typed").is_file()
    assert not [c for c in classifiers if c.startswith("License ::")]  # `license` says it (SPDX)


@pytest.mark.parametrize(
    ("path", "key"),
    [("ci/gitlab/fxcache.gitlab-ci.yml", ".fxcache"), ("ci/buildkite/pipeline.yml", None)],
)
def test_other_ci_installs_the_wheel_this_versions_release_carries(
    path: str, key: str | None
) -> None:
    """The package is not on PyPI: the examples install the wheel the release workflow attaches
    to the GitHub release of pyproject's version (a release that forgets to move it fails here)."""
    from ci_fxcache import __version__

    doc = yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))
    variables = doc[key]["variables"] if key else doc["env"]
    wheel = f"ci_fxcache-{__version__}-py3-none-any.whl"
    assert variables["FXCACHE_INSTALL"] == (
        f"ci-fxcache @ {REPOSITORY}/releases/download/v{__version__}/{wheel}"
    )
    assert "ci_fxcache-${TAG#v}-py3-none-any.whl" in (
        ROOT / ".github/workflows/release.yml"
    ).read_text(encoding="utf-8")
