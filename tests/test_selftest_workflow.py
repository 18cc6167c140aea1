"""The project's own self-test workflow (.github/workflows/self-test.yml) under act in host
mode, as written: `uses: ./` with store github, the first job cold and saving to the Actions
cache (tests/fake_cache_service.py), the second job on an empty store restoring what the first
saved and checking the action's outputs (.github/scripts/selftest_check.py). actions/checkout
is a stand-in (tests/act/standins/checkout) that copies the tree. The checker itself is tested
on wrong outputs below, without act."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT, TORCH_PYTHON, load_script
from tests.fake_cache_service import FakeCacheService
from tests.fake_github import FakeGitHub
from tests.test_action_e2e import SHIPPED, _act, _pin, act_events

WORKFLOW = ".github/workflows/self-test.yml"
CHECKER = ROOT / ".github/scripts/selftest_check.py"
REPOSITORY = "octo-org/fxcache-action"
COMBO = "sin_matmul-cpu-float32-static-fxgraph-infer"


def _checker() -> ModuleType:
    return load_script(CHECKER, "selftest_check")


def _outputs(tmp_path: Path, **changes: str) -> dict[str, str]:
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"schema": "fxcache-results/2", "settings": {"phase": "hot"}}))
    report = tmp_path / "report.md"
    report.write_text("### fxcache: ✅ 1/1 safe\n")
    env = {"CACHE_KEY": "fxcache-v1-linux-x86_64-abc", "CACHE_HIT": "true",
           "SAFE_COMBOS": json.dumps([COMBO]), "UNSAFE_COUNT": "0",
           "REPORT_JSON": str(results), "REPORT_MARKDOWN": str(report)}  # fmt: skip
    return {**env, **changes}


def _expect(hit: str = "true", key: str = "fxcache-v1-linux-x86_64-abc") -> argparse.Namespace:
    return argparse.Namespace(combo=COMBO, expect_hit=hit, expect_key=key, expect_phase="hot")


def test_checker_passes_right_outputs(tmp_path: Path) -> None:
    assert _checker().problems(_outputs(tmp_path), _expect()) == []


@pytest.mark.parametrize(
    ("changes", "expect", "word"),
    [({"CACHE_HIT": "false"}, {}, "cache-hit"),
     ({}, {"key": "fxcache-v1-linux-x86_64-other"}, "first job's"),
     ({"SAFE_COMBOS": "[]"}, {}, "safe-combos"),
     ({"UNSAFE_COUNT": "1"}, {}, "unsafe-count"),
     ({"REPORT_JSON": "/nonexistent/results.json"}, {}, "report-json"),
     ({"REPORT_MARKDOWN": ""}, {}, "report-markdown"),
     ({}, {"hit": "false"}, "cache-hit")],
)  # fmt: skip
def test_checker_names_each_wrong_output(
    tmp_path: Path, changes: dict[str, str], expect: dict[str, str], word: str
) -> None:
    found = _checker().problems(_outputs(tmp_path, **changes), _expect(**expect))
    assert len(found) == 1 and word in found[0], found


def test_checker_exits_1_with_annotations(tmp_path: Path) -> None:
    env = {**os.environ, **_outputs(tmp_path, CACHE_HIT="false")}
    proc = subprocess.run(
        ["python3", str(CHECKER), "--combo", COMBO, "--expect-hit", "true"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith("::error::self-test: cache-hit is 'false'"), proc.stdout


@pytest.fixture
def servers() -> Iterator[tuple[FakeGitHub, FakeCacheService]]:
    with FakeGitHub(repository=REPOSITORY) as github, FakeCacheService() as cache:
        yield github, cache


def _repo(base: Path) -> Path:
    src = base / "repo"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for rel in [*SHIPPED, ".github"]:
        path = ROOT / rel
        if path.is_dir():
            shutil.copytree(path, src / rel, ignore=ignore)
        else:
            shutil.copy2(path, src / rel)
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@invalid"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "t"],
                 ["remote", "add", "origin", f"https://github.com/{REPOSITORY}.git"]):  # fmt: skip
        subprocess.run([*git, *args], check=True, capture_output=True)
    return src


@pytest.mark.slow
def test_self_test_workflow_under_act(
    tmp_path: Path, servers: tuple[FakeGitHub, FakeCacheService]
) -> None:
    github, cache = servers
    src = _repo(tmp_path)
    event = tmp_path / "event.json"
    repo = {"id": 1, "full_name": REPOSITORY, "default_branch": "main"}
    event.write_text(json.dumps({"ref": "refs/heads/main", "repository": repo}))
    checkout = f"actions/checkout@{_pin('actions/checkout', WORKFLOW)}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    argv = [
        _act(), "push", "--json", "-W", WORKFLOW, "-e", str(event),
        "-P", "ubuntu-latest=-self-hosted", "--action-offline-mode",
        "--local-repository", f"{checkout}={ROOT / 'tests/act/standins/checkout'}",
        "--env", "GITHUB_RUN_ID=5100", "--env", f"SRC={src}",
        "--env", f"GITHUB_API_URL={github.url}", "--env", "TORCHINDUCTOR_COMPILE_THREADS=1",
        *[arg for k, v in cache.env().items() for arg in ("--env", f"{k}={v}")],
        "--var", f"FXCACHE_SELFTEST_PYTHON={TORCH_PYTHON}",
        "-s", f"GITHUB_TOKEN={github.token}",
    ]  # fmt: skip
    proc = subprocess.run(
        argv, cwd=src, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    raw = proc.stdout + proc.stderr
    events = act_events(raw)
    log = "\n".join(str(e.get("msg", "")).rstrip() for e in events)[-8000:] or raw[-8000:]
    results = {str(e["job"]): e["jobResult"] for e in events if "jobResult" in e}
    assert proc.returncode == 0 and sorted(results.values()) == ["success"] * 2, log
    # Each job's check ran and passed: the first a miss, the second a hit of the same key.
    assert raw.count("self-test: the action's outputs are as expected") >= 2, log
    # What the second job restored is what the first job saved, through the cache service:
    # one entry, under this run's key suffix.
    committed = [e.key for e in cache.committed()]
    assert len(committed) == 1 and "-selftest-5100-1-run5100." in committed[0], committed
    assert [e for e in events if e.get("command") == "error"] == [], log
    assert cache.violations == [] and github.violations == []
