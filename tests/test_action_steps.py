"""The action's steps (`fxcache action <step>`) run as the runner runs them: inputs as JSON in
FXCACHE_INPUTS, GitHub's default variables and event payload, $GITHUB_OUTPUT / $GITHUB_ENV
files read back with the runner's own parsing rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, TORCH_PYTHON
from tests.fake_cache_service import FakeCacheService
from tests.runner_sim import run_event

REPO_ID = 1296269
DEFAULT_INPUTS = {
    name: spec.get("default", "")
    for name, spec in yaml.safe_load((ROOT / "action.yml").read_text())["inputs"].items()
}


def read_file_vars(path: Path) -> dict[str, str]:
    """Parse an Actions environment file ($GITHUB_OUTPUT / $GITHUB_ENV) as the runner does:
    `NAME=value` lines and `NAME<<DELIMITER` blocks (a later value wins)."""
    values: dict[str, str] = {}
    lines = path.read_text().split("\n") if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line:
            i += 1
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            end = lines.index(delimiter, i + 1)
            values[name] = "\n".join(lines[i + 1 : end])
            i = end + 1
            continue
        name, _, value = line.partition("=")
        values[name] = value
        i += 1
    return values


def pull_request_event(
    head_name: str = "octo-org/demo",
    head_id: int = REPO_ID,
    base_name: str = "octo-org/demo",
    base_fork: bool = False,
    head_fork: bool = False,
) -> dict[str, Any]:
    base = {"id": REPO_ID, "full_name": base_name, "fork": base_fork}
    head = {"id": head_id, "full_name": head_name, "fork": head_fork}
    return {
        "number": 7,
        "pull_request": {"number": 7, "head": {"repo": head}, "base": {"repo": base}},
        "repository": {**base, "default_branch": "main"},
    }


def save_inputs(event: dict[str, Any] | None = None, event_name: str = "pull_request",
                signing_key: str = "") -> str:  # fmt: skip
    """The save sub-action's FXCACHE_INPUTS, as its JavaScript builds them."""
    payload = pull_request_event() if event is None else event
    return json.dumps({"python": "", "signing-key": signing_key, "toolkit": "",
                       "run-event": run_event(event_name, payload)})  # fmt: skip


class Step:
    """One `fxcache action STEP` run: exit code, log lines, outputs and exported variables."""

    def __init__(
        self, proc: subprocess.CompletedProcess[str], out: Path, env: Path, state: Path
    ) -> None:
        self.proc = proc
        self.lines = (proc.stdout + proc.stderr).splitlines()
        self.outputs = read_file_vars(out)
        self.env = read_file_vars(env)
        self.state = read_file_vars(state)

    def post_env(self) -> dict[str, str]:
        """What the runner hands this (setup) step's post step: STATE_<name> variables."""
        return {f"STATE_{name}": value for name, value in self.state.items()}

    @property
    def errors(self) -> list[str]:
        return [line for line in self.lines if line.startswith("::error::")]

    def settings(self) -> dict[str, Any]:
        return dict(json.loads(Path(self.outputs["settings"]).read_text()))


def run_step(
    tmp_path: Path,
    step: str,
    inputs: dict[str, str] | None = None,
    event: dict[str, Any] | None = None,
    event_name: str = "pull_request",
    **env_overrides: str,
) -> Step:
    out, genv, state = (tmp_path / name for name in ("github-output", "github-env", "state"))
    for path in (out, genv, state):
        path.write_text("")
    event_path = tmp_path / "event.json"
    payload = pull_request_event() if event is None else event
    event_path.write_text(json.dumps(payload))
    values = {**DEFAULT_INPUTS, "python": TORCH_PYTHON, "cache-root": str(tmp_path / "store")}
    values["github-token"] = "ghs_token"
    values["run-event"] = run_event(event_name, payload)  # what the runner fills in
    values.update(inputs or {})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
    env.update(
        {
            "GITHUB_ACTIONS": "true",
            "GITHUB_OUTPUT": str(out),
            "GITHUB_ENV": str(genv),
            "GITHUB_STATE": str(state),
            "GITHUB_REPOSITORY": "octo-org/demo",
            "GITHUB_EVENT_NAME": event_name,
            "GITHUB_EVENT_PATH": str(event_path),
            "GITHUB_REF": "refs/pull/7/merge",
            "GITHUB_RUN_ID": "4242",
            "GITHUB_RUN_ATTEMPT": "2",
            "RUNNER_TEMP": str(tmp_path / "runner-temp"),
            "RUNNER_TOOL_CACHE": str(tmp_path / "tool-cache"),
            "FXCACHE_INPUTS": json.dumps(values),
        }
    )
    env.update(env_overrides)
    proc = subprocess.run(
        [sys.executable, "-m", "ci_fxcache", "action", step],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return Step(proc, out, genv, state)


def test_same_repository_pull_request(tmp_path: Path) -> None:
    s = run_step(tmp_path, "setup")
    assert s.proc.returncode == 0, s.lines
    work = tmp_path / "runner-temp" / "fxcache" / "fxcache"
    assert s.outputs["settings"] == str(work / "settings.json")
    assert s.env == {
        "FXCACHE_ACTION_SETTINGS": str(work / "settings.json"),
        "FXCACHE_PYTHON": TORCH_PYTHON,
    }
    settings = s.settings()
    assert settings["root"] == str(tmp_path / "store")
    assert settings["read_only"] is False and settings["untrusted"] is None
    assert settings["comment"] is True
    assert (settings["store"], settings["remote"], _upload(settings)) == ("local", False, False)
    assert settings["timeout_s"] == 600
    assert (work / "pr-number").read_text() == "7\n"
    # Runner-held, for the post step: the toolkit setup ran in, and its settings' digest.
    assert s.state["fxcache_toolkit"] == str(Path(sys.executable).with_name("fxcache"))
    assert set(s.state) == {"fxcache_toolkit", "fxcache_settings", "fxcache_settings_sha256"}


def test_pull_request_inside_a_repository_that_is_a_fork(tmp_path: Path) -> None:
    """acme/vllm is itself a fork of vllm-project/vllm: its own pull requests (head and base
    the same repository, `fork: true` on both) are trusted."""
    event = pull_request_event("acme/vllm", REPO_ID, "acme/vllm", base_fork=True, head_fork=True)
    s = run_step(tmp_path, "setup", event=event, GITHUB_REPOSITORY="acme/vllm")
    assert s.proc.returncode == 0, s.lines
    settings = s.settings()
    assert settings["read_only"] is False and settings["untrusted"] is None
    assert settings["comment"] is True


def test_a_renamed_repository_is_still_itself(tmp_path: Path) -> None:
    event = pull_request_event(head_name="octo-org/old-name", head_id=REPO_ID)
    assert run_step(tmp_path, "setup", event=event).settings()["read_only"] is False


def test_fork_pull_request_is_read_only_and_leaves_the_comment_to_the_follow_up(
    tmp_path: Path,
) -> None:
    event = pull_request_event(head_name="someone/demo", head_id=REPO_ID + 1, head_fork=True)
    s = run_step(tmp_path, "setup", event=event)
    assert s.proc.returncode == 0, s.lines
    settings = s.settings()
    assert settings["read_only"] is True and settings["comment"] is False
    assert settings["untrusted"] == "pull request from fork someone/demo"
    assert any(line.startswith("::notice::fxcache: pull request from a fork") for line in s.lines)


def test_a_fork_with_the_same_name_is_still_a_fork(tmp_path: Path) -> None:
    """Only the ids decide: a fork can be named like the base repository."""
    event = pull_request_event(head_name="octo-org/demo", head_id=REPO_ID + 1)
    assert run_step(tmp_path, "setup", event=event).settings()["read_only"] is True


def test_explicit_read_only_and_comment(tmp_path: Path) -> None:
    s = run_step(tmp_path, "setup", {"read-only": "true", "comment": "false"})
    settings = s.settings()
    assert (settings["read_only"], settings["comment"]) == (True, False)
    # An untrusted run stays read-only whatever the input says.
    event = pull_request_event(head_name="someone/demo", head_id=REPO_ID + 1)
    forked = run_step(tmp_path, "setup", {"read-only": "false", "comment": "true"}, event=event)
    assert (forked.settings()["read_only"], forked.settings()["comment"]) == (True, True)


def test_push_neither_comments_nor_is_read_only(tmp_path: Path) -> None:
    event = {"repository": {"id": REPO_ID, "default_branch": "main"}}
    s = run_step(tmp_path, "setup", event=event, event_name="push")
    settings = s.settings()
    assert (settings["read_only"], settings["comment"]) == (False, False)
    assert not (tmp_path / "runner-temp/fxcache/fxcache/pr-number").exists()


def test_store_github_keys(tmp_path: Path) -> None:
    s = run_step(tmp_path, "setup", {"store": "github", "key-suffix": "llama"})
    assert s.proc.returncode == 0, s.lines
    scope = subprocess.run(
        [sys.executable, "-m", "ci_fxcache", "key", "--python", TORCH_PYTHON],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    settings = s.settings()
    # A run that may not upload keeps its commits in its own namespace (issue 39).
    root = tmp_path / "store" / ("" if _upload(settings) else ".remote-readers")
    assert settings["root"] == str(root)
    choice = settings["choice"]  # the store, decided once (issue 39)
    assert (choice["kind"], choice["key_suffix"]) == ("github", "llama")
    # The entry key is the tier's, from the scope key each call passes (issue 48).
    from ci_fxcache.store.remote.github import tier

    run = {"GITHUB_RUN_ID": "4242", "GITHUB_RUN_ATTEMPT": "2"}
    assert tier.entry_key(scope, "llama", run) == f"{scope}-llama-run4242.2"
    assert tier.entry_prefix(scope, "llama") == f"{scope}-llama-"


@pytest.mark.parametrize(
    ("save", "event_name", "ref", "upload"),
    [
        ("auto", "push", "refs/heads/main", True),
        ("auto", "schedule", "refs/heads/main", True),
        ("auto", "push", "refs/heads/feature", False),
        ("auto", "pull_request", "refs/pull/7/merge", False),
        ("always", "pull_request", "refs/pull/7/merge", True),
        ("never", "push", "refs/heads/main", False),
    ],
)
def test_store_github_save_policy(
    tmp_path: Path, save: str, event_name: str, ref: str, upload: bool
) -> None:
    event = pull_request_event() if event_name == "pull_request" else None
    if event is None:
        event = {"repository": {"id": REPO_ID, "default_branch": "main"}}
    s = run_step(
        tmp_path, "setup", {"store": "github", "save": save}, event, event_name, GITHUB_REF=ref
    )
    settings = s.settings()
    assert _upload(settings) is upload
    # Issue 39: what a run that may not upload commits stays out of what uploads read.
    shared = tmp_path / "store"
    assert Path(settings["root"]) == (shared if upload else shared / ".remote-readers")


def test_untrusted_runs_never_upload_even_with_save_always(tmp_path: Path) -> None:
    event = pull_request_event(head_name="someone/demo", head_id=REPO_ID + 1)
    s = run_step(tmp_path, "setup", {"store": "github", "save": "always"}, event=event)
    assert _upload(s.settings()) is False


def test_store_redis_without_url_runs_local_only_with_a_notice(tmp_path: Path) -> None:
    s = run_step(tmp_path, "setup", {"store": "redis"})
    assert s.proc.returncode == 0, s.lines
    assert s.settings()["remote"] is False
    notices = [line for line in s.lines if line.startswith("::notice::")]
    assert any("store redis without a redis-url" in line for line in notices), s.lines


def test_store_redis_is_remote_only_for_trusted_runs(tmp_path: Path) -> None:
    url = "redis://:hunter2@cache.internal:6379/0"
    trusted = run_step(tmp_path, "setup", {"store": "redis", "redis-url": url})
    assert trusted.settings()["remote"] is True
    assert "::add-mask::" + url in trusted.lines
    assert "hunter2" not in Path(trusted.outputs["settings"]).read_text()
    event = pull_request_event(head_name="someone/demo", head_id=REPO_ID + 1)
    fork = run_step(tmp_path, "setup", {"store": "redis", "redis-url": url}, event=event)
    assert fork.settings()["remote"] is False
    assert any("nothing reaches the shared cache" in line for line in fork.lines)


def test_unwritable_cache_root_falls_back_to_runner_temp(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    s = run_step(tmp_path, "setup", {"cache-root": str(blocker / "store")})
    assert s.proc.returncode == 0, s.lines
    fallback = tmp_path / "runner-temp" / "fxcache-store"
    assert s.settings()["root"] == str(fallback) and fallback.is_dir()
    warnings = [line for line in s.lines if line.startswith("::warning::")]
    assert len(warnings) == 1 and f"cache root {blocker / 'store'} is not writable" in warnings[0]


def test_unwritable_tool_cache_falls_back_to_runner_temp(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    s = run_step(tmp_path, "setup", {"cache-root": ""}, RUNNER_TOOL_CACHE=str(blocker))
    assert s.proc.returncode == 0, s.lines
    assert s.settings()["root"] == str(tmp_path / "runner-temp" / "fxcache-store")


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"store": "gcs"}, "input store must be one of: local github redis s3 object (got 'gcs')"),
        ({"object-url": "gcs://b/p"}, "input object-url is not an s3://BUCKET/PREFIX or"),
        ({"read-only": "yes"}, "input read-only must be one of: auto true false"),
        ({"comment": "always"}, "input comment must be one of: auto true false"),
        ({"fail-on": "sometimes"}, "input fail-on must be one of: never unsafe error no-gain"),
        ({"on-unsafe": "ignore"}, "input on-unsafe must be one of: disable keep"),
        ({"save": "sometimes"}, "input save must be one of: auto always never"),
        ({"invalidate-on-upgrade": "1"}, "input invalidate-on-upgrade must be one of"),
        ({"timeout-minutes": "0"}, "input timeout-minutes must be a positive number"),
        ({"timeout-minutes": "ten"}, "input timeout-minutes must be a positive number"),
        ({"timeout-minutes": "inf"}, "input timeout-minutes must be a finite number of minutes"),
        ({"timeout-minutes": "1e300"}, "input timeout-minutes must be a finite number of minutes"),
        ({"min-speedup": "-1"}, "input min-speedup must be a number >= 0"),
        ({"report-id": "a/b"}, "input report-id: invalid report id 'a/b'"),
        ({"report-id": ".."}, "input report-id: invalid report id '..'"),
        ({"report-id": "x\ny"}, "input report-id: invalid report id"),
        ({"key-suffix": "a,b"}, "input key-suffix: invalid key suffix 'a,b'"),
        ({"key-suffix": "team/model"}, "input key-suffix: invalid key suffix 'team/model'"),
        ({"redis-url": "http://x"}, "input redis-url is not a Redis URL"),
        ({"dtypes": "bf17"}, "--dtypes bf17: unknown dtype value 'bf17'"),
        ({"workloads": "my model"}, "unknown workload 'my model'"),
    ],
)
def test_bad_inputs_fail_with_one_error_line(
    tmp_path: Path, inputs: dict[str, str], message: str
) -> None:
    s = run_step(tmp_path, "setup", inputs)
    assert s.proc.returncode == 2
    assert len(s.errors) == 1 and message in s.errors[0].replace("%0A", "\n"), s.lines
    assert s.outputs == {} and s.env == {}
    assert not (tmp_path / "store").exists(), "the store was touched before the inputs were checked"


def test_inputs_that_disagree_with_the_action_file_are_a_clear_error(tmp_path: Path) -> None:
    values = dict(DEFAULT_INPUTS, colour="blue", **{"run-event": run_event("push", {})})
    s = run_step(tmp_path, "setup", FXCACHE_INPUTS=json.dumps(values))
    assert s.proc.returncode == 2 and len(s.errors) == 1
    assert "undeclared: ['colour']" in s.errors[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["verify", "--report-id", "a/b"],
        ["plan", "--report-id", "../x"],
        ["merge", "x.json", "--report-id", "a b"],
        ["comment", "x.json", "--report-id", "<!--"],
    ],
)
def test_every_command_rejects_an_unsafe_report_id(argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
    env["GITHUB_ACTIONS"] = "true"
    proc = subprocess.run([sys.executable, "-m", "ci_fxcache", *argv], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 2
    lines = (proc.stdout + proc.stderr).splitlines()
    assert len(lines) == 1 and lines[0].startswith("::error::fxcache: "), lines
    assert "invalid report id" in lines[0]


def test_outputs_survive_newlines_and_forged_delimiters(tmp_path: Path) -> None:
    """A value with newlines, `=` and a line that looks like a heredoc cannot end the value
    early or inject another output."""
    from ci_fxcache import gha

    out = tmp_path / "out"
    out.write_text("")
    evil = "a\nb=c\nEOF\nsafe-combos<<EOF\n[]\nEOF"
    os.environ["GITHUB_OUTPUT"] = str(out)
    try:
        gha.set_output("report-json", evil)
        gha.set_output("cache-hit", "true")
        with pytest.raises(ValueError, match="not a valid name"):
            gha.set_output("x\ny", "z")
    finally:
        del os.environ["GITHUB_OUTPUT"]
    assert read_file_vars(out) == {"report-json": evil, "cache-hit": "true"}


def test_conclude_fails_with_the_deferred_verify_status(tmp_path: Path) -> None:
    s = run_step(tmp_path, "setup")
    settings = s.outputs["settings"]
    ok = run_step(tmp_path, "conclude", FXCACHE_ACTION_SETTINGS=settings)
    assert ok.proc.returncode == 0
    from ci_fxcache.action import job_record

    job_record.update(Path(settings).parent, verify_rc=1)
    failed = run_step(tmp_path, "conclude", FXCACHE_ACTION_SETTINGS=settings)
    assert failed.proc.returncode == 1 and failed.errors == []


def test_save_without_the_action_is_a_clear_error_and_the_post_step_a_no_op(
    tmp_path: Path,
) -> None:
    s = run_step(tmp_path, "save", FXCACHE_INPUTS=save_inputs())
    assert s.proc.returncode == 2 and len(s.errors) == 1
    assert "run the fxcache action" in s.errors[0]
    post = run_step(tmp_path, "post-save")
    assert post.proc.returncode == 0 and post.errors == []
    assert "nothing to save" in post.proc.stdout


@pytest.mark.parametrize(
    ("on_unsafe", "disabled", "warning"),
    [
        ("disable", "1", "2 declared combination(s) unsafe; Inductor caches are disabled"),
        ("keep", None, "2 declared combination(s) unsafe; caches stay enabled (on-unsafe: keep)"),
    ],
)
def test_report_disables_caches_for_later_steps_when_unsafe(
    tmp_path: Path, on_unsafe: str, disabled: str | None, warning: str
) -> None:
    settings = run_step(tmp_path, "setup").outputs["settings"]
    work = Path(settings).parent
    (work / "results.json").write_text((ROOT / "tests/data/results_h200.json").read_text())
    s = run_step(tmp_path, "report", {"on-unsafe": on_unsafe}, FXCACHE_ACTION_SETTINGS=settings,
                 GITHUB_STEP_SUMMARY=str(tmp_path / "summary.md"))  # fmt: skip
    assert s.proc.returncode == 0, s.lines
    assert s.env.get("TORCHINDUCTOR_FORCE_DISABLE_CACHES") == disabled
    assert s.outputs["unsafe-count"] == "2"
    assert s.outputs["report-markdown"] == str(work / "report.md")
    assert any(line.startswith("::warning::fxcache: " + warning) for line in s.lines), s.lines


def test_safe_results_leave_caches_on(tmp_path: Path) -> None:
    settings = run_step(tmp_path, "setup").outputs["settings"]
    (Path(settings).parent / "results.json").write_text(
        (ROOT / "tests/data/results_cpu.json").read_text()
    )
    s = run_step(tmp_path, "report", FXCACHE_ACTION_SETTINGS=settings)
    assert s.proc.returncode == 0 and "TORCHINDUCTOR_FORCE_DISABLE_CACHES" not in s.env


@pytest.mark.parametrize(
    ("rel", "runs"),
    [("action.yml", ["main", "post"]), ("save/action.yml", ["save"]),
     ("invalidate/action.yml", ["invalidate"])],
)  # fmt: skip
def test_inputs_are_declared_once(rel: str, runs: list[str]) -> None:
    """The action file's inputs are exactly the table the toolkit checks, and the JavaScript
    hands every step all of them (`describe` names them) as one JSON object."""
    from ci_fxcache.action import inputs, steps

    doc = yaml.safe_load((ROOT / rel).read_text())
    assert doc["runs"]["using"] == "node24"
    assert list(doc["inputs"]) == [i.name for i in inputs.TABLES[rel]]
    for run in runs:
        assert steps.describe(run)["inputs"] == list(doc["inputs"]), run


def test_outputs_are_declared_once() -> None:
    from ci_fxcache.action import steps

    outputs = yaml.safe_load((ROOT / "action.yml").read_text())["outputs"]
    assert list(outputs) == list(steps.OUTPUTS)
    assert all(set(spec) == {"description"} for spec in outputs.values()), outputs


def _upload(settings: dict[str, Any]) -> bool:
    """May this run write the remote tier (setup's store choice)?"""
    choice = settings["choice"]
    return bool(choice["kind"] in ("s3", "github", "object") and choice["may_write_remote"])


POST_STATE: dict[str, dict[str, str]] = {}  # settings file -> what its post step gets


def _post(runner: Path, settings: Path | str, **env: str) -> Step:
    """The action's post step (post-save) of the job whose setup wrote `settings`."""
    return run_step(runner, "post-save", **POST_STATE[str(settings)], **env)


def _scope_dir(settings: Path) -> Path:
    """The scope directory the restore of the job whose setup wrote `settings` handed out."""
    state = json.loads((settings.parent / "restore-state.json").read_text())
    return Path(state["scope_dir"])


def _github_job(
    runner: Path, fake: FakeCacheService, save: str = "always", **env: str
) -> tuple[Path, Step]:
    """setup and restore (with the cache service's variables: `fxcache restore --store
    github`) of a `store: github` job on a fresh runner; (settings file, restore step)."""
    runner.mkdir(parents=True, exist_ok=True)
    inputs = {"store": "github", "save": save}
    setup = run_step(runner, "setup", inputs)
    settings = setup.outputs["settings"]
    POST_STATE[settings] = setup.post_env()
    restored = run_step(runner, "restore", inputs, FXCACHE_ACTION_SETTINGS=settings,
                        **fake.env(), **env)  # fmt: skip
    assert restored.proc.returncode == 0 and restored.errors == [], restored.lines
    return Path(settings), restored


def test_store_github_end_of_job_save_uploads_and_the_next_runner_restores_it(
    tmp_path: Path,
) -> None:
    """The post step (no save sub-action) uploads through the cache service itself; a fresh
    runner's restore finds the entry by the scope prefix; a run that adds nothing, a
    `save: never` run and a step without the service's variables upload nothing."""
    with FakeCacheService() as fake:
        settings, first = _github_job(tmp_path / "a", fake)
        assert first.outputs["cache-hit"] == "false"
        compiled = _scope_dir(settings) / "inductor" / "fxgraph" / "graph.bin"
        compiled.parent.mkdir(parents=True, exist_ok=True)
        compiled.write_bytes(b"compiled by the job")
        post = _post(tmp_path / "a", settings, **fake.env())  # fmt: skip
        assert post.proc.returncode == 0 and post.errors == [], post.lines
        key = f"{first.outputs['cache-key']}-run4242.2"
        assert [e.key for e in fake.committed()] == [key], post.lines
        assert "GitHub cache entry" in post.proc.stdout and "saved" in post.proc.stdout

        settings_b, second = _github_job(tmp_path / "b", fake)
        assert second.outputs["cache-hit"] == "true", second.lines
        again = _scope_dir(settings_b) / "inductor" / "fxgraph" / "graph.bin"
        assert again.read_bytes() == b"compiled by the job"
        post_b = _post(tmp_path / "b", settings_b, **fake.env())  # fmt: skip
        assert "this run added nothing to the cache" in post_b.proc.stdout, post_b.lines
        assert len(fake.committed()) == 1

        settings_c, _ = _github_job(tmp_path / "c", fake, save="never")
        added = _scope_dir(settings_c) / "inductor" / "new.bin"
        added.write_bytes(b"new")
        _post(tmp_path / "c", settings_c, **fake.env())  # fmt: skip
        assert len(fake.committed()) == 1
        assert fake.violations == []


def test_store_github_upload_without_the_service_variables_warns(tmp_path: Path) -> None:
    with FakeCacheService() as fake:
        settings, _ = _github_job(tmp_path, fake)
        added = _scope_dir(settings) / "inductor" / "new.bin"
        added.write_bytes(b"new")
        post = _post(tmp_path, settings)  # fmt: skip
        assert post.proc.returncode == 0, post.lines
        warnings = [line for line in post.lines if line.startswith("::warning::")]
        assert any("kept locally" in w and "JavaScript" in w for w in warnings), post.lines
        assert fake.committed() == []


def test_store_github_save_sub_action_decides_then_its_javascript_step_uploads(
    tmp_path: Path,
) -> None:
    """The save sub-action (a JavaScript action: its step has the cache service's variables)
    commits, decides and uploads; the end-of-job save then has nothing left to do."""
    with FakeCacheService() as fake:
        settings, _ = _github_job(tmp_path, fake)
        added = _scope_dir(settings) / "inductor" / "new.bin"
        added.write_bytes(b"new")
        saved = run_step(tmp_path, "save", FXCACHE_INPUTS=save_inputs(),
                         FXCACHE_ACTION_SETTINGS=str(settings), **fake.env())  # fmt: skip
        assert saved.outputs["saved"] == "true", saved.lines
        assert saved.proc.returncode == 0 and len(fake.committed()) == 1, saved.lines
        post = _post(tmp_path, settings, **fake.env())
        assert "already saved" in post.proc.stdout and len(fake.committed()) == 1
        assert fake.violations == []


def test_store_github_a_corrupt_entry_is_a_warning_and_a_cold_start(tmp_path: Path) -> None:
    with FakeCacheService() as fake:
        settings, _ = _github_job(tmp_path / "a", fake)
        added = _scope_dir(settings) / "inductor" / "new.bin"
        added.write_bytes(os.urandom(4096))
        _post(tmp_path / "a", settings, **fake.env())
        (entry,) = fake.committed()
        data = fake.blob_bytes(entry)
        fake.blobs[entry.blob].data = data[: len(data) // 2]
        runner = tmp_path / "b"
        runner.mkdir()
        inputs = {"store": "github"}
        settings_b = run_step(runner, "setup", inputs).outputs["settings"]
        restored = run_step(runner, "restore", inputs, FXCACHE_ACTION_SETTINGS=settings_b,
                            **fake.env())  # fmt: skip
        assert restored.proc.returncode == 0, restored.lines
        assert any("restoring from the GitHub cache failed" in line for line in restored.lines)
        assert restored.outputs["cache-hit"] == "false"


@pytest.mark.parametrize(
    ("save", "event_name", "ref", "fork", "writes"),
    [
        ("auto", "push", "refs/heads/main", False, True),
        ("auto", "schedule", "refs/heads/main", False, True),
        ("auto", "push", "refs/heads/feature", False, False),
        ("auto", "pull_request", "refs/pull/7/merge", False, False),
        ("always", "pull_request", "refs/pull/7/merge", False, True),
        ("always", "pull_request", "refs/pull/7/merge", True, False),
        ("never", "push", "refs/heads/main", False, False),
    ],
)
def test_store_s3_writes_only_from_the_default_branch(
    tmp_path: Path, save: str, event_name: str, ref: str, fork: bool, writes: bool
) -> None:
    """Issue 32: with `save: auto` only push and schedule runs on the default branch write the
    bucket; the others restore with --remote-read-only (and their save commits locally)."""
    if event_name == "pull_request":
        event = pull_request_event(head_id=REPO_ID + 1 if fork else REPO_ID)
    else:
        event = {"repository": {"id": REPO_ID, "default_branch": "main"}}
    inputs = {"store": "s3", "s3-url": "s3://acme-ci-caches/fxcache", "save": save}
    s = run_step(tmp_path, "setup", inputs, event, event_name, GITHUB_REF=ref)
    assert s.proc.returncode == 0, s.lines
    settings = s.settings()
    assert settings["remote"] is True and _upload(settings) is writes
    # Issue 39: a run that commits but may not write the bucket commits into its own trust
    # namespace of the runner's store, which no writing run reads or publishes (a fork's run
    # is read-only: a private overlay of the shared root, never saved).
    shared = tmp_path / "store"
    own = writes or settings["read_only"]
    assert Path(settings["root"]) == (shared if own else shared / ".remote-readers"), settings


@pytest.mark.parametrize(
    "name",
    ["GITHUB_API_URL", "GITHUB_EVENT_PATH", "RUNNER_TEMP", "ACTIONS_RUNTIME_TOKEN", "PATH",
     "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "NODE_OPTIONS", "BASH_ENV",
     "AWS_SECRET_ACCESS_KEY", "FXCACHE_SIGNING_KEY", "FXCACHE_INPUTS"],
)  # fmt: skip
def test_no_step_can_hand_on_what_steers_the_runner_or_an_interpreter(name: str) -> None:
    """Issue 32: the toolkit is the one home of which names pass between its steps; a name
    that steers the runner, node, Python, the loader or carries a secret never can."""
    from ci_fxcache import names

    with pytest.raises(ValueError, match="can never be handed"):
        names.check_passable(name)


def test_every_declared_hand_on_is_allowed() -> None:
    from ci_fxcache.action import steps

    handed = {n for run in steps.RUNS for s in steps.describe(run)["steps"] for n in s["passes"]}
    assert handed == {"FXCACHE_ACTION_SETTINGS"}


# Issue 39 item 5: the one environment write left under action/, by (function, variable):
# the inputs' removal once read (it passes nothing: no process started later inherits them).
ENV_WRITES_ALLOWED = {("from_env", "names.INPUTS_ENV")}
_ENV_MUTATORS = ("pop", "update", "setdefault", "clear", "popitem", "__setitem__", "__delitem__")


def _environ_writes(source: str) -> list[tuple[str, str, int]]:
    """(enclosing function, variable or '?', line) of every write to os.environ in `source`:
    item assignment or deletion, a mutating method, os.putenv / os.unsetenv."""
    import ast

    def is_environ(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
            isinstance(node, ast.Name) and node.id == "environ"
        )

    def name_of(node: ast.AST) -> str:
        if isinstance(node, ast.Constant):
            return str(node.value)
        return ast.unparse(node) if isinstance(node, ast.Attribute) else "?"

    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Subscript) and is_environ(target.value):
                found.append((function, name_of(target.slice), target.lineno))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            mutates = is_environ(func.value) and func.attr in _ENV_MUTATORS
            if mutates or func.attr in ("putenv", "unsetenv"):
                found.append((function, name_of(node.args[0]) if node.args else "?", node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "<module>")
    return found


def test_the_action_passes_values_as_arguments_never_through_os_environ() -> None:
    """Issue 39: the action's steps hand the signing key, the Redis and S3 URLs, the GitHub
    token and setup's nonce to the toolkit as arguments; nothing under action/ writes this
    process's environment (GitHub's own mechanisms, $GITHUB_ENV / $GITHUB_STATE, live in
    gha.py and hand values to later steps, not to this one's code)."""
    action = ROOT / "ci_fxcache" / "action"
    wrong = [
        f"{path.name}:{line} {function}() writes {name}"
        for path in sorted(action.glob("*.py"))
        for function, name, line in _environ_writes(path.read_text(encoding="utf-8"))
        if (function, name) not in ENV_WRITES_ALLOWED
    ]
    assert wrong == []
    # The check sees every kind of write (it is not vacuous).
    planted = (
        "import os\n"
        "def a(v):\n    os.environ['X'] = v\n"
        "def b():\n    os.environ.pop('Y', None)\n"
        "def c(d):\n    os.environ.update(d)\n"
        "def d():\n    del os.environ['Z']\n"
        "def e():\n    os.putenv('W', '1')\n"
    )
    assert [(f, n) for f, n, _ in _environ_writes(planted)] == [
        ("a", "X"), ("b", "Y"), ("c", "?"), ("d", "Z"), ("e", "W")
    ]  # fmt: skip


def test_the_job_record_round_trips_and_refuses_what_it_is_not(tmp_path: Path) -> None:
    """The steps hand the job along in one typed, versioned record (issue 47 item 7)."""
    from ci_fxcache.action import job_record
    from ci_fxcache.action.job_record import JobRecord
    from ci_fxcache.errors import UsageError

    assert JobRecord.read(tmp_path) == JobRecord()  # none yet
    job_record.update(tmp_path, restore_s=1.25)
    record = job_record.update(tmp_path, save_s=0.5, saved=True)
    assert record == JobRecord(restore_s=1.25, save_s=0.5, saved=True)
    assert JobRecord.read(tmp_path) == record == JobRecord.from_json(record.to_json())
    assert record.timings == {"restore_s": 1.25, "save_s": 0.5}
    assert sorted(p.name for p in tmp_path.iterdir()) == [job_record.FILE]
    for bad in ('{"schema": "other/1"}', f'{{"schema": "{job_record.SCHEMA}", "saved": "yes"}}',
                f'{{"schema": "{job_record.SCHEMA}", "verify_rc": true}}',
                f'{{"schema": "{job_record.SCHEMA}", "extra": 1}}', "[]"):  # fmt: skip
        with pytest.raises(ValueError):
            JobRecord.from_json(bad)
    (tmp_path / job_record.FILE).write_text("{not json")
    with pytest.raises(UsageError, match="not the job's record"):
        JobRecord.read(tmp_path)


@pytest.mark.parametrize("url", ["az://acme-ci-caches/fxcache", "gs://acme-ci-caches/fxcache"])
def test_store_object_takes_its_service_from_the_urls_scheme_and_the_same_save_policy(
    tmp_path: Path, url: str
) -> None:
    """Issue 48: `store: object` with `object-url:` is the tier of `fxcache restore --store
    object --object-url`, written only from the default branch like store s3."""
    event = {"repository": {"id": REPO_ID, "default_branch": "main"}}
    for ref, writes in (("refs/heads/main", True), ("refs/heads/topic", False)):
        inputs = {"store": "object", "object-url": url}
        runner = tmp_path / ref[-4:]
        runner.mkdir()
        s = run_step(runner, "setup", inputs, event, "push", GITHUB_REF=ref)
        assert s.proc.returncode == 0, s.lines
        settings = s.settings()
        assert settings["remote"] is True and _upload(settings) is writes, settings
        assert (settings["choice"]["kind"], settings["choice"]["url"]) == ("object", url)
    (tmp_path / "none").mkdir()
    s = run_step(tmp_path / "none", "setup", {"store": "object"}, event, "push",
                 GITHUB_REF="refs/heads/main")  # fmt: skip
    assert s.settings()["remote"] is False
    assert any("store object without an object-url" in line for line in s.lines), s.lines


def test_the_restore_step_starts_the_interpreter_report_before_it_imports_the_other_steps(
    tmp_path: Path,
) -> None:
    """The restore step is on every job's critical path and waits on the job's interpreter
    reporting its versions: that report starts (env.pending_fingerprint is imported for it)
    before the inputs' table is imported, and the other steps (steps.py) are never imported
    (`-X importtime` prints each module as its import ends, nested ones first)."""
    setup = run_step(tmp_path, "setup")
    assert setup.proc.returncode == 0, setup.lines
    restored = run_step(tmp_path, "restore", FXCACHE_ACTION_SETTINGS=setup.outputs["settings"],
                        PYTHONPROFILEIMPORTTIME="1")  # fmt: skip
    assert restored.proc.returncode == 0, restored.lines[-20:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in restored.proc.stderr.splitlines()
                if line.startswith("import time:")]  # fmt: skip
    assert "ci_fxcache.action.restore_step" in imported, imported[-20:]
    assert "ci_fxcache.action.steps" not in imported
    report = imported.index("ci_fxcache.env.pending_fingerprint")
    assert report < imported.index("ci_fxcache.action.inputs"), imported
    state = Path(setup.outputs["settings"]).parent / "restore-state.json"
    assert json.loads(state.read_text())["scope_key"]  # it restored
