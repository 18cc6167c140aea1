"""The action end to end: tests/act/workflows/e2e.yml under act in host mode (no Docker), using
the action from the working tree (`uses: ./`) with the local store, a real torch compile on CPU,
and tests/fake_github.py as the GitHub API (GITHUB_API_URL).

act's `--json` log carries what the runner received: step-summary contents, `::error::` lines
(act does not render annotations) and job results. The workflow's last steps write the action's
outputs and the environment later steps see into $E2E_OUT.

One job's life, in one test because each run builds on the store the previous one left (and
the cold compiles are shared): 1 cold runner, 2 restored (hot-only, hits), 3 tampered store
(quarantined, cold fallback), 4 a fork's pull request (read-only, no comment), 5 the fleet
workflow (plan -> verify -> merge), 6 the invalidate sub-action. The invalid-input run is a
separate test: it stops before anything is compiled or restored. One scenario runs act itself,
and so every step, as an unprivileged user (`nobody` under root: tests/nonroot.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, TORCH_PYTHON
from tests.fake_cache_service import FakeCacheService
from tests.fake_github import FakeGitHub
from tests.faults import truncate
from tests.nonroot import NOBODY_GID, NonRoot, pip_env

pytestmark = pytest.mark.slow

REPOSITORY = "octo-org/fxcache-demo"
PR = 7
COMBO = "sin_matmul-cpu-float32-static-fxgraph-infer"
LABEL = "fxcache-e2e"
# What the action needs from the working tree (a real checkout would bring all of it).
SHIPPED = ["action.yml", "js", "save", "invalidate", "toolkit", "scripts", "ci_fxcache",
           "pyproject.toml", "README.md"]  # fmt: skip
# The action under another owner's name, pinned by commit (how the shipped workflows' headers
# tell users to pin it): the only name act can resolve for it.
FOREIGN = "acme/compile-cache"
PINNED = "9f2c4e1b7a3d5c6e8f0a1b2c3d4e5f60718293a4"
PLACEHOLDER = re.compile(r"your-org/fxcache-action([/a-z]*)@0{40}")


def _pinned(text: str) -> str:
    """A workflow with the fxcache placeholder pinned (the sed line of the workflows' headers)."""
    return PLACEHOLDER.sub(rf"{FOREIGN}\1@{PINNED}", text)


def _pin(action: str, rel: str) -> str:
    """The commit `rel` pins `action` to (each stand-in is mapped to exactly that)."""
    pins = set(re.findall(rf"{action}@([0-9a-f]{{40}})", (ROOT / rel).read_text()))
    assert len(pins) == 1, pins
    return pins.pop()


def _standins(src: Path) -> list[str]:
    """--local-repository mappings: act resolves every remote action before evaluating `if:`
    and cannot fetch offline. The artifact actions get stand-ins with their documented
    behaviour (see tests/act/standins); our own action is the tree under
    test, under a foreign name pinned by commit. The GitHub cache needs none: the toolkit
    speaks the cache service itself, here tests/fake_cache_service.py."""
    standins = ROOT / "tests" / "act" / "standins"
    fleet = "workflows/fxcache-verify.yml"
    maps = {
        f"actions/upload-artifact@{_pin('actions/upload-artifact', fleet)}": standins
        / "upload-artifact",
        f"actions/download-artifact@{_pin('actions/download-artifact', fleet)}": standins
        / "download-artifact",
        f"{FOREIGN}@{PINNED}": src,  # no mapping for fxcache/fxcache-action at all
    }
    return [arg for ref, path in maps.items() for arg in ("--local-repository", f"{ref}={path}")]


def act_events(raw: str) -> list[dict[str, Any]]:
    """The JSON objects of act's `--json` log, one per line (other lines skipped)."""
    events = []
    for line in raw.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _act() -> str:
    exe = Path(sys.executable).with_name("act")
    found = str(exe) if exe.exists() else shutil.which("act")
    assert found, "act is not installed: run the README's test set-up command"
    return found


@dataclass
class ActRun:
    """One `act` invocation: its exit code, its JSON log, and what the workflow wrote out."""

    name: str
    returncode: int
    events: list[dict[str, Any]]
    out: Path
    raw: str = field(repr=False)

    def _distinct(self, command: str, key: str) -> list[str]:
        # Composite steps are logged for the inner and the outer step: keep each once.
        seen: list[str] = []
        for event in self.events:
            if event.get("command") == command and event.get(key) not in seen:
                seen.append(str(event.get(key)))
        return seen

    @property
    def summary(self) -> str:
        return "".join(self._distinct("summary", "content"))

    @property
    def errors(self) -> list[str]:
        return [e.strip() for e in self._distinct("error", "raw")]

    @property
    def notices(self) -> list[str]:
        return [e.strip() for e in self._distinct("notice", "raw")]

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0 and any(e.get("jobResult") == "success" for e in self.events)

    def log(self) -> str:
        """The log as a person reads it (for assertion messages)."""
        lines = []
        for line in self.raw.splitlines():  # act's JSON events, and anything it said besides
            try:
                lines.append(str(json.loads(line).get("msg", "")).rstrip())
            except (ValueError, AttributeError):
                lines.append(line)
        text = "\n".join(lines)[-8000:]
        return f"--- act run {self.name!r} (exit {self.returncode}) ---\n{text}"

    def json(self, name: str) -> dict[str, Any]:
        path = self.out / name
        assert path.exists(), f"{name} was not written\n{self.log()}"
        doc = json.loads(path.read_text())
        assert isinstance(doc, dict)
        return doc


class Harness:
    """A repository checkout for act plus the state that survives between runs of one job.
    With `user`, act (and so every step of the job) runs as that unprivileged user, in a
    checkout, HOME and act cache that user owns: `base` must be a directory it owns."""

    def __init__(
        self, base: Path, fake: FakeGitHub, cache: FakeCacheService, user: NonRoot | None = None
    ) -> None:
        self.base = base
        self.user = user
        self.fake = fake
        self.cache = cache  # the Actions cache service (store github)
        self.src = base / "repo"
        self.cache_root = base / "store"
        self.xdg = base / "xdg"  # act's own cache: workspaces and RUNNER_TOOL_CACHE
        self.artifacts = base / "artifacts"
        self.run_id = 4000
        self._make_repo()
        if user is not None and user.prefix:
            subprocess.run(["chown", "-R", f"{user.uid}:{NOBODY_GID}", str(self.src)], check=True)

    def _make_repo(self) -> None:
        self.src.mkdir(parents=True)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
        for rel in SHIPPED:
            path = ROOT / rel
            if path.is_dir():
                shutil.copytree(path, self.src / rel, ignore=ignore)
            else:
                shutil.copy2(path, self.src / rel)
        (self.src / ".github/workflows").mkdir(parents=True)
        workflows = [
            *(ROOT / "tests/act/workflows").glob("*.yml"),
            ROOT / "workflows/fxcache-verify.yml",
        ]
        # The fleet workflow too, copied into the repository and pinned as users are told to.
        for workflow in workflows:
            pinned = _pinned(workflow.read_text())
            assert not re.search(r"uses: .*fxcache-action", pinned), workflow
            (self.src / ".github/workflows" / workflow.name).write_text(pinned)
        shutil.copy(ROOT / "tests/act/user_compile.py", self.src / "user_compile.py")
        git = ["git", "-C", str(self.src), "-c", "user.name=e2e", "-c", "user.email=e2e@invalid"]
        for args in (
            ["init", "-q", "-b", "feature"],
            ["add", "-A"],
            ["commit", "-q", "-m", "e2e"],
            ["remote", "add", "origin", f"https://github.com/{REPOSITORY}.git"],
        ):
            subprocess.run([*git, *args], check=True, capture_output=True)

    def _event(self, event_name: str, fork: bool = False) -> dict[str, Any]:
        repo = {"id": 1296269, "full_name": REPOSITORY, "fork": False, "default_branch": "main"}
        if event_name == "push":
            return {"ref": "refs/heads/main", "repository": repo}
        head = repo
        if fork:
            head = {"id": 7001, "full_name": f"someone/{REPOSITORY.split('/')[1]}", "fork": True}
        return {
            "action": "synchronize",
            "number": PR,
            "pull_request": {
                "number": PR,
                "head": {"ref": "feature", "repo": head},
                "base": {"ref": "main", "repo": repo},
            },
            "repository": repo,
        }

    def run(
        self,
        name: str,
        dtypes: str = "float32",
        fork: bool = False,
        workflow: str = "e2e.yml",
        store: str = "local",
        cache_root: Path | None = None,
        event_name: str = "pull_request",
        save: str = "auto",
        redis_url: str = "",
        mechanisms: str = "fxgraph",
        signing_key: str = "e2e-signing-key",
    ) -> ActRun:
        self.run_id += 1
        out = self.base / f"out-{name}"
        out.mkdir()
        event = self.base / f"event-{name}.json"
        event.write_text(json.dumps(self._event(event_name, fork)))
        if self.user is None:
            prefix: list[str] = []
            python = TORCH_PYTHON
            env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
        else:
            prefix, python, env = self.user.prefix, self.user.python, self.user.env(pip_env())
            if prefix:
                os.chown(out, self.user.uid, NOBODY_GID)
        env["XDG_CACHE_HOME"] = str(self.xdg)
        argv = [
            *prefix, _act(), event_name, "--json",
            "-W", f".github/workflows/{workflow}",
            "-e", str(event),
            "-P", f"{LABEL}=-self-hosted",
            "--action-offline-mode",
            *_standins(self.src),
            "--env", f"GITHUB_RUN_ID={self.run_id}",
            # A runner gives these to JavaScript steps only; act (which has no v2 cache
            # service) passes --env values to every step.
            *[arg for k, v in self.cache.env().items() for arg in ("--env", f"{k}={v}")],
            "--var", f"E2E_STORE={store}",
            "--var", f"E2E_SAVE={save}",
            "--var", f"E2E_REDIS_URL={redis_url}",
            "--var", f"E2E_MECHANISMS={mechanisms}",
            "--env", f"E2E_ARTIFACTS={self.artifacts}",
            "--env", f"SRC={self.src}",
            "--env", f"E2E_OUT={out}",
            "--env", f"GITHUB_API_URL={self.fake.url}",
            "--env", "TORCHINDUCTOR_COMPILE_THREADS=1",
            "--var", f"E2E_PYTHON={python}",
            "--var", f"E2E_DTYPES={dtypes}",
            "--var", f"E2E_CACHE_ROOT={cache_root or self.cache_root}",
            "-s", f"GITHUB_TOKEN={self.fake.token}",
            *(["-s", f"FXCACHE_SIGNING_KEY={signing_key}"] if signing_key else []),
        ]  # fmt: skip
        proc = subprocess.run(
            argv, cwd=self.src, env=env, capture_output=True, text=True, timeout=900, check=False
        )
        raw = proc.stdout + proc.stderr
        return ActRun(name, proc.returncode, act_events(raw), out, raw)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeGitHub]:
    with FakeGitHub(repository=REPOSITORY) as server:
        server.add_pull(PR)
        yield server


@pytest.fixture
def cache_service() -> Iterator[FakeCacheService]:
    with FakeCacheService() as server:
        yield server


def _combo(results: dict[str, Any]) -> dict[str, Any]:
    combos = [c for c in results["combos"] if c["id"] == COMBO]
    assert len(combos) == 1, [c["id"] for c in results["combos"]]
    return combos[0]


def _our_comments(fake: FakeGitHub) -> list[dict[str, Any]]:
    return [c for c in fake.comments[PR] if c["user"]["login"] == "github-actions[bot]"]


def _scope_dirs(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.is_dir() and p.name.startswith("fxcache-v1-")]


def test_action_end_to_end(
    tmp_path: Path, fake: FakeGitHub, cache_service: FakeCacheService
) -> None:
    harness = Harness(tmp_path, fake, cache_service)

    # 1. A cold runner: nothing to restore; verify compiles cold then hot; the report lands in
    #    the job summary and as a PR comment; save commits the store.
    first = harness.run("first")
    assert first.succeeded, first.log()
    out = first.json("outputs.json")
    assert out["CACHE_KEY"].startswith("fxcache-v1-linux-"), out
    assert out["CACHE_HIT"] == "false", out
    assert json.loads(out["SAFE_COMBOS"]) == [COMBO], out
    assert out["UNSAFE_COUNT"] == "0", out
    assert out["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] is None, out
    scope = harness.cache_root / out["CACHE_KEY"]
    # With a signing key the job compiles into a private overlay, which save merges (issue 26).
    overlay = Path(out["TORCHINDUCTOR_CACHE_DIR"]).parent
    assert overlay.parent == harness.cache_root / ".overlays", out
    assert out["TRITON_CACHE_DIR"] == str(overlay / "triton"), out
    manifest_doc = json.loads((scope / "manifest.json").read_text())
    assert manifest_doc.get("signature"), "save did not sign the manifest with the secret key"
    results = first.json("results.json")
    assert results["settings"]["phase"] == "both", results["settings"]
    assert results["settings"]["min_speedup"] == 0.0, results["settings"]  # the workflow's input
    combo = _combo(results)
    assert combo["verdict"] == "safe", combo
    assert combo["cold"]["status"] == "ok" and combo["hot"]["status"] == "ok", combo
    assert combo["max_abs_err"]["hot_vs_cold"] == 0.0, combo
    user = first.json("user.json")
    assert user["cache_dir"] == str(overlay / "inductor")
    assert user["inductor"].get("fxgraph_cache_miss", 0) >= 1, user
    # The job summary the runner received is the rendered report (one safe combination), and
    # the PR comment carries the same report.
    report_md = (first.out / "report.md").read_text().strip()
    assert first.summary.strip().startswith(report_md)
    assert "fxcache job cache stats" in first.summary
    assert re.match(r"### fxcache( \(.+\))?: ✅ 1/1 safe · ", report_md), report_md  # none unsafe
    comments = _our_comments(fake)
    assert len(comments) == 1, fake.comments
    assert report_md.splitlines()[0] in comments[0]["body"]
    assert "1 safe" in comments[0]["body"]
    assert first.errors == [], first.errors
    assert first.json("save.json") == {"saved": "true"}
    # The save sub-action saved; the action's end-of-job save then does nothing.
    assert "already saved in this job (saved: true)" in first.raw, first.log()

    # 2. The same job again: the store restores (cache-hit), verify runs the hot phase only
    #    against the recorded reference, and it hits; the user's own compile hits too. The
    #    sticky comment is updated, not duplicated.
    second = harness.run("second")
    assert second.succeeded, second.log()
    out2 = second.json("outputs.json")
    assert out2["CACHE_KEY"] == out["CACHE_KEY"]
    assert out2["CACHE_HIT"] == "true", out2
    assert json.loads(out2["SAFE_COMBOS"]) == [COMBO], out2
    results2 = second.json("results.json")
    assert results2["settings"]["phase"] == "hot", results2["settings"]
    combo2 = _combo(results2)
    assert combo2["verdict"] == "safe", combo2
    assert combo2["hot"]["counters"].get("fxgraph_cache_hit", 0) >= 1, combo2
    assert combo2["hot"]["counters"].get("fxgraph_cache_miss", 0) == 0, combo2
    user2 = second.json("user.json")
    assert user2["inductor"].get("fxgraph_cache_hit", 0) >= 1, user2
    assert user2["inductor"].get("fxgraph_cache_miss", 0) == 0, user2
    assert len(_our_comments(fake)) == 1, fake.comments
    assert fake.calls("PATCH", rf"/repos/{REPOSITORY}/issues/comments/\d+"), "comment not updated"

    # 3. Tamper with the stored cache: restore must quarantine the scope and the job falls back
    #    to a cold compile that still passes with correct results.
    victims = sorted(p for p in (scope / "verify").rglob("*") if p.is_file())
    assert victims, "nothing stored under verify/"
    victim = max(victims, key=lambda p: p.stat().st_size)
    truncate(victim)
    tampered = harness.run("tampered")
    assert tampered.succeeded, tampered.log()
    out3 = tampered.json("outputs.json")
    assert out3["CACHE_HIT"] == "false", out3
    quarantine = harness.cache_root / ".quarantine"
    assert quarantine.is_dir() and any(quarantine.iterdir()), "tampered scope not quarantined"
    results3 = tampered.json("results.json")
    assert results3["settings"]["phase"] == "both", results3["settings"]
    combo3 = _combo(results3)
    assert combo3["verdict"] == "safe", combo3
    assert combo3["cold"]["status"] == "ok", combo3
    assert combo3["max_abs_err"]["hot_vs_cold"] == 0.0, combo3
    assert tampered.json("save.json") == {"saved": "true"}

    # 4. A pull request from a fork (GitHub gives its run no secrets): it restores and
    #    verifies, but read-only (its compiles go to an overlay, save writes nothing) and it
    #    leaves the comment to the workflow_run follow-up (its token could not write).
    manifest = (scope / "manifest.json").read_bytes()
    writes = len(fake.calls("POST", r".*/comments")) + len(fake.calls("PATCH"))
    fork = harness.run("fork", fork=True, signing_key="")
    assert fork.succeeded, fork.log()
    out4 = fork.json("outputs.json")
    assert out4["CACHE_HIT"] == "true", out4
    assert not out4["TORCHINDUCTOR_CACHE_DIR"].startswith(str(scope)), out4
    assert json.loads(out4["SAFE_COMBOS"]) == [COMBO], (out4, fork.json("results.json"))
    assert fork.json("save.json") == {"saved": "false"}
    assert (scope / "manifest.json").read_bytes() == manifest, "a fork's run wrote the store"
    assert any("pull request from a fork" in n for n in fork.notices), fork.notices
    assert len(fake.calls("POST", r".*/comments")) + len(fake.calls("PATCH")) == writes

    # 5. The fleet: workflows/fxcache-verify.yml called with one pool (this runner). plan ->
    #    verify (the action at its release tag = this tree) uploads the pool's results -> merge
    #    renders one fleet report and keeps its own sticky comment (report id "fleet").
    fleet = harness.run("fleet", workflow="fleet.yml")
    assert fleet.succeeded, fleet.log()
    jobs = {
        str(e["job"]).rsplit("/", 1)[-1].strip()
        for e in fleet.events
        if e.get("jobResult") == "success"
    }
    assert jobs == {"plan", "verify (fxcache-e2e)", "merge"}, jobs
    shard = harness.artifacts / "fxcache-fleet-pool-fxcache-e2e" / "results.json"
    assert shard.is_file(), sorted(p.name for p in harness.artifacts.iterdir())
    assert _combo(json.loads(shard.read_text()))["verdict"] == "safe"
    fleet_comments = [
        c for c in _our_comments(fake) if c["body"].startswith("<!-- fxcache-report:fleet -->")
    ]
    assert len(fleet_comments) == 1, fake.comments
    assert "1 safe" in fleet_comments[0]["body"]
    assert len(_our_comments(fake)) == 2, "the fleet comment replaced the action's"
    assert "1 safe" in fleet.summary
    assert fleet.errors == [], fleet.errors

    # 6. Scheduled invalidation with the invalidate sub-action: a dry run lists the scope (an
    #    older torch than 99) and keeps it; the real run removes it.
    #    Then the repository's GitHub caches through the API: ours go, foreign keys stay.
    ours = fake.add_cache(f"{scope.name}-run41.1", ref="refs/heads/main")
    foreign = fake.add_cache("npm-linux-x64-5f1c2a", ref="refs/heads/main")
    #    The scope quarantined in step 3 goes by the same policy.
    set_aside = sorted(p.name for p in quarantine.iterdir() if p.is_dir())
    assert set_aside, "the quarantined scope of step 3 is gone"
    invalidate = harness.run("invalidate", workflow="invalidate.yml")
    assert invalidate.succeeded, invalidate.log()
    dry = invalidate.json("dry.json")
    assert sorted((r["scope"], r["action"]) for r in dry["rows"]) == sorted(
        [(scope.name, "would remove")] + [(name, "would remove") for name in set_aside]
    )
    assert sorted(r["scope"] for r in dry["rows"] if r["quarantined"]) == set_aside
    real = invalidate.json("real.json")
    assert sorted((r["scope"], r["action"]) for r in real["rows"]) == sorted(
        [(scope.name, "removed")] + [(name, "removed") for name in set_aside]
    )
    assert not scope.exists() and list(quarantine.iterdir()) == []
    github = invalidate.json("github.json")
    assert [(r["scope"], r["action"]) for r in github["rows"]] == [(ours["key"], "removed")]
    assert fake.caches == [foreign]
    assert fake.calls("DELETE", rf"/repos/{REPOSITORY}/actions/caches/{ours['id']}")
    assert fake.violations == [], fake.violations


def test_invalid_input_fails_with_one_clear_error(
    tmp_path: Path, fake: FakeGitHub, cache_service: FakeCacheService
) -> None:
    harness = Harness(tmp_path, fake, cache_service)
    run = harness.run("invalid", dtypes="bf17")
    assert run.returncode != 0 and not run.succeeded, run.log()
    assert len(run.errors) == 1, run.errors
    assert run.errors[0].startswith("::error::fxcache: "), run.errors
    assert "bf17" in run.errors[0], run.errors
    assert not (run.out / "outputs.json").exists(), "the job went on after a usage error"
    assert not harness.cache_root.exists(), "the store was touched before the inputs were checked"


def test_store_github_uploads_only_new_files_from_the_default_branch(
    tmp_path: Path, fake: FakeGitHub, cache_service: FakeCacheService
) -> None:
    """`store: github` on fresh hosted runners, `save: auto` (pull requests never upload:
    tests/test_action_steps.py::test_store_github_save_policy), with the save sub-action: a
    push to main uploads under <scope key>-run<id>.<attempt> through the cache service; the
    next push restores it by the scope prefix (a cache hit for fxcache), runs the hot phase
    only and, having added nothing, uploads nothing."""
    harness = Harness(tmp_path, fake, cache_service)
    first = harness.run("gh-first", store="github", cache_root=tmp_path / "runner-1",
                        event_name="push")  # fmt: skip
    assert first.succeeded, first.log()
    out = first.json("outputs.json")
    assert out["CACHE_HIT"] == "false", out
    assert first.json("save.json") == {"saved": "true"}
    saved = [e.key for e in cache_service.committed()]
    assert saved == [f"{out['CACHE_KEY']}-run{harness.run_id}.1"], saved

    second = harness.run("gh-second", store="github", cache_root=tmp_path / "runner-2",
                         event_name="push")  # fmt: skip
    assert second.succeeded, second.log()
    out2 = second.json("outputs.json")
    assert out2["CACHE_KEY"] == out["CACHE_KEY"]
    assert out2["CACHE_HIT"] == "true", out2
    results = second.json("results.json")
    assert results["settings"]["phase"] == "hot", results["settings"]
    combo = _combo(results)
    assert combo["verdict"] == "safe", combo
    assert combo["hot"]["counters"].get("fxgraph_cache_hit", 0) >= 1, combo
    assert second.json("user.json")["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert "this run added nothing to the cache" in second.raw, second.log()
    assert [e.key for e in cache_service.committed()] == saved
    assert second.errors == [] and fake.violations == [] and cache_service.violations == []


def test_store_github_end_of_job_save_uploads_when_a_test_step_fails(
    tmp_path: Path, fake: FakeGitHub, cache_service: FakeCacheService
) -> None:
    """`store: github` without the save sub-action, and a failing test step: the action's
    post step commits the scope and uploads it through the cache service; a job on another
    fresh runner restores that entry and its own compile hits."""
    harness = Harness(tmp_path, fake, cache_service)
    failed = harness.run("gh-autosave", workflow="autosave.yml", store="github", save="always",
                         cache_root=tmp_path / "runner-1")  # fmt: skip
    assert failed.returncode != 0 and not failed.succeeded, failed.log()
    key = (failed.out / "cache-key").read_text()
    assert [e.key for e in cache_service.committed()] == [f"{key}-run{harness.run_id}.1"], (
        failed.log()
    )
    again = harness.run("gh-autosave-again", workflow="autosave.yml", store="github",
                        save="always", cache_root=tmp_path / "runner-2")  # fmt: skip
    assert (tmp_path / "runner-2" / key / "manifest.json").is_file(), again.log()
    user = again.json("user.json")
    assert user["cache_dir"].startswith(str(tmp_path / "runner-2")), user
    assert user["inductor"].get("fxgraph_cache_hit", 0) >= 1, user
    assert user["inductor"].get("fxgraph_cache_miss", 0) == 0, user
    assert cache_service.violations == [] and fake.violations == []


def test_the_job_saves_at_its_end_even_when_a_test_step_fails(
    tmp_path: Path, fake: FakeGitHub, cache_service: FakeCacheService
) -> None:
    """The action as acme/compile-cache@<commit> (no name but that one resolves), no save
    sub-action, and a failing test step: a miss, a safe verdict, the report, and the action's
    own post step commits the scope (with the user's compile in it) and writes the job's cache
    stats; the next job is a hit whose stats say it compiled nothing new. The user's step sees
    neither the action's inputs nor its signing key."""
    harness = Harness(tmp_path, fake, cache_service)
    failed = harness.run("autosave", workflow="autosave.yml")
    assert failed.returncode != 0 and not failed.succeeded, failed.log()
    # act resolved the action by the foreign name and commit, and by nothing else.
    assert f"{FOREIGN} with ref {PINNED}" in failed.raw, failed.log()
    assert "fxcache/fxcache-action" not in failed.raw
    key = (failed.out / "cache-key").read_text()
    assert (failed.out / "cache-hit").read_text() == "false"
    assert json.loads((failed.out / "safe-combos").read_text()) == [COMBO]
    manifest = json.loads((harness.cache_root / key / "manifest.json").read_text())
    assert any(name.startswith("inductor/") for name in manifest["files"]), manifest["files"]
    assert manifest.get("signature"), "the post step did not sign with the action's key"
    assert failed.json("user.json")["inductor"].get("fxgraph_cache_miss", 0) >= 1
    assert "1 safe" in failed.summary, failed.log()
    assert "| FX graph |" in failed.summary, failed.summary
    user_env = (failed.out / "user-env.txt").read_text()
    assert "FXCACHE_INPUTS" not in user_env and "e2e-signing-key" not in user_env

    again = harness.run("autosave-again", workflow="autosave.yml")
    assert (again.out / "cache-key").read_text() == key
    assert (again.out / "cache-hit").read_text() == "true", again.log()
    user = again.json("user.json")
    assert user["inductor"].get("fxgraph_cache_hit", 0) >= 1, user
    assert user["inductor"].get("fxgraph_cache_miss", 0) == 0, user
    assert "compiled nothing new" in again.summary, again.summary


def _pt2_keys(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return len(client.keys("pt2:*"))  # KEYS names each key once; SCAN may repeat one
    finally:
        client.close()


def test_store_redis_shares_compiles_between_runners(
    tmp_path: Path, fake: FakeGitHub, cache_service: FakeCacheService, redis_url: str
) -> None:
    """`store: redis` with a real redis-server: runner A (empty local root) compiles and writes
    through Redis; runner B (another empty root) gets the FX graphs from Redis, in its own
    compile step and in the report (the remote mechanism's hot phase hits); a fork's run on
    runner C never writes Redis."""
    harness = Harness(tmp_path, fake, cache_service)
    remote = COMBO.replace("-fxgraph-", "-remote-")
    before = _pt2_keys(redis_url)
    a = harness.run("redis-a", store="redis", cache_root=tmp_path / "runner-a",
                    redis_url=redis_url, mechanisms="remote")  # fmt: skip
    assert a.succeeded, a.log()
    assert "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=1" in (a.out / "job-env.txt").read_text()
    assert a.json("user.json")["inductor"].get("fxgraph_cache_miss", 0) >= 1
    written = _pt2_keys(redis_url)
    assert written > before, "runner A wrote nothing to Redis"

    b = harness.run("redis-b", store="redis", cache_root=tmp_path / "runner-b",
                    redis_url=redis_url, mechanisms="remote")  # fmt: skip
    assert b.succeeded, b.log()
    user = b.json("user.json")
    assert user["cache_dir"].startswith(str(tmp_path / "runner-b")), user
    assert user["inductor"].get("fxgraph_cache_hit", 0) >= 1, user
    assert user["inductor"].get("fxgraph_cache_miss", 0) == 0, user
    results = b.json("results.json")
    assert results["cache"]["store"] == "redis" and results["cache"]["redis"]["reachable"]
    combo = next(c for c in results["combos"] if c["id"] == remote)
    # On a CPU the hot process loads the graph from Redis but rebuilds its C++ kernels (Redis
    # carries generated source): the report says "hit" and, honestly, no-gain (safe on GPUs).
    assert combo["verdict"] in ("safe", "no-gain"), combo
    assert combo["hot"]["counters"].get("fxgraph_cache_hit", 0) >= 1, combo
    assert combo["verdict"] == "safe" or combo.get("cause", "rebuilt") == "rebuilt", combo
    report = (b.out / "report.md").read_text()
    # the report's evidence fold: | combination | cause | hits/misses | ...
    row = re.search(r"^\| [^|]*remote[^|]* \| [^|]+ \| (\d+)/(\d+) \|", report, flags=re.M)
    assert row and int(row.group(1)) >= 1 and row.group(2) == "0", "the report shows no Redis hit"

    # A fork's run given the Redis URL (issue 32): the action refuses to start, before any
    # code of the pull request runs beside it; a fork's run without it keeps Redis off.
    keys = _pt2_keys(redis_url)
    fork = harness.run("redis-fork", fork=True, store="redis", cache_root=tmp_path / "runner-c",
                       redis_url=redis_url, mechanisms="remote", signing_key="")  # fmt: skip
    assert not fork.succeeded and len(fork.errors) == 1, fork.log()
    assert "did not review" in fork.errors[0] and "redis-url" in fork.errors[0], fork.errors
    fork = harness.run("redis-fork-no-url", fork=True, store="redis",
                       cache_root=tmp_path / "runner-c", mechanisms="remote",
                       signing_key="")  # fmt: skip
    assert fork.succeeded, fork.log()
    assert "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE" not in (fork.out / "job-env.txt").read_text()
    assert _pt2_keys(redis_url) == keys, "a fork's run wrote the shared Redis cache"
    assert fake.violations == []


_PROBE_WRITES = """
import errno, json, sys
result = {}
for path in sys.argv[1:]:
    try:
        with open(path, "ab"):
            result[path] = "ok"
    except OSError as exc:
        result[path] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(result))
"""


def _writable_as(user: NonRoot, paths: list[Path]) -> dict[str, str]:
    """For each path: "ok" when `user` can open it for writing, else the errno's name."""
    proc = user.run(["python", "-c", _PROBE_WRITES, *map(str, paths)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, str] = json.loads(proc.stdout)
    return result


def test_a_non_root_runner_compiles_again_after_the_end_of_job_save(
    fake: FakeGitHub, cache_service: FakeCacheService, nonroot: NonRoot
) -> None:
    """The job as a self-hosted runner runs it, as an unprivileged user (`nobody` when the
    suite runs as root; root ignores file modes): act and every step of the job run as that
    user, with the toolkit installed into act's tool cache. Without a signing key the trusted
    job compiles into the scope in place, where Inductor reopens its lock files for writing on
    every compile. The first job saves at its end (the post step); the next job restores that
    scope, and its verify and the user's own torch.compile hit without a PermissionError
    (issue 23 §1: a save that made the locks read-only broke every later compile)."""
    harness = Harness(nonroot.mkdir("e2e"), fake, cache_service, user=nonroot)
    first = harness.run("nonroot-first", workflow="autosave.yml", signing_key="")
    assert first.returncode != 0 and not first.succeeded, first.log()  # its test step fails
    assert "PermissionError" not in first.raw, first.log()
    key = (first.out / "cache-key").read_text()
    assert (first.out / "cache-hit").read_text() == "false", first.log()
    assert json.loads((first.out / "safe-combos").read_text()) == [COMBO], first.log()
    scope = harness.cache_root / key
    manifest = json.loads((scope / "manifest.json").read_text())
    committed = [scope / rel for rel in manifest["files"]]
    assert any(rel.startswith("inductor/") for rel in manifest["files"]), first.log()
    user = first.json("user.json")
    assert user["cache_dir"] == str(scope / "inductor"), user  # in place, not an overlay
    assert user["inductor"].get("fxgraph_cache_miss", 0) >= 1, user
    toolkits = list(harness.xdg.rglob("fxcache-toolkit"))
    assert toolkits, f"no toolkit under act's tool cache {harness.xdg}\n{first.log()}"
    assert {p.stat().st_uid for p in [*toolkits, scope, *committed]} == {nonroot.uid}

    again = harness.run("nonroot-again", workflow="autosave.yml", signing_key="")
    assert "PermissionError" not in again.raw, again.log()
    assert (again.out / "cache-key").read_text() == key
    assert (again.out / "cache-hit").read_text() == "true", again.log()
    assert json.loads((again.out / "safe-combos").read_text()) == [COMBO], again.log()
    user = again.json("user.json")
    assert user["cache_dir"] == str(scope / "inductor"), user
    assert user["inductor"].get("fxgraph_cache_hit", 0) >= 1, user
    assert user["inductor"].get("fxgraph_cache_miss", 0) == 0, user

    # Committed artifacts stay read-only for the user who saved them; its locks stay writable.
    locks = sorted((scope / "inductor").rglob("*.lock"))
    assert locks, "Inductor wrote no lock file: the scenario no longer covers them"
    writable = _writable_as(nonroot, [*committed, *locks])
    assert {writable[str(p)] for p in committed} == {"EACCES"}, writable
    assert {writable[str(p)] for p in locks} == {"ok"}, writable
    assert fake.violations == [] and cache_service.violations == []
