"""The action's steps: each reads the checked inputs and setup's settings, runs fxcache
commands in this process, and writes the step outputs. Outputs are declared in OUTPUTS."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_fxcache import gha, names
from ci_fxcache.action import inputs as inp
from ci_fxcache.action import job_compiles, job_record, job_stats, restore_step
from ci_fxcache.action.inputs import Input
from ci_fxcache.action.settings import (
    DIGEST_STATE,
    SETTINGS_STATE,
    TOOLKIT_STATE,
    Settings,
    comment_decision,
    fxcache_executable,
    load,
    remote_write_decision,
    runner_temp,
    store_root,
)
from ci_fxcache.errors import EXIT_CHECK_FAILED, UsageError
from ci_fxcache.store import state_file, tiered, trust
from ci_fxcache.store.layout import trust_root
from ci_fxcache.store.remote.factory import StorePolicy, store_policy

# The main action's outputs: name -> id of the step that writes it (action.yml's `outputs:`
# maps each to `steps.<id>.outputs.<name>`; tests/test_action_inputs.py checks it).
OUTPUTS = {
    "cache-key": "restore",
    "cache-hit": "restore",
    "safe-combos": "report",
    "unsafe-count": "report",
    "report-json": "verify",
    "report-markdown": "report",
}
# Never given to a step unless listed for it: the cache service's variables, the store
# credentials, OIDC token requests and the main step's own state file (the runner hands the
# post step what main kept there).
PRIVATE_ENV = (
    *names.CACHE_SERVICE_ENV,
    *names.OBJECT_STORE_ENV,
    *names.OIDC_ENV,
    "GITHUB_STATE",
)


@dataclass(frozen=True)
class StepSpec:
    """One toolkit step as the JavaScript runs it: its log group, the secret inputs it sees
    (the others are blank in its FXCACHE_INPUTS), the variables it gets beyond the job's
    environment without PRIVATE_ENV, and the names it hands on to the later steps of its run
    through $GITHUB_ENV (nothing else it or a process it starts writes there reaches them)."""

    step: str
    title: str
    secrets: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    passes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Run:
    """What one JavaScript entry point runs: its action's inputs, its steps in order, the
    prefixes of job variables none of its steps gets (besides INPUT_*, STATE_*, PRIVATE_ENV),
    the job variables main keeps for the post step (runner-held state) and those the post
    step takes from there instead of from the job."""

    inputs: tuple[Input, ...]
    steps: tuple[StepSpec, ...]
    withheld: tuple[str, ...] = ()
    keep_for_post: tuple[str, ...] = ()
    from_main: tuple[str, ...] = ()


def _admit(table: tuple[Input, ...]) -> StepSpec:
    """The first step of every run: it sees every secret the run was given (and runs nothing
    but the toolkit) to refuse the run when it must hold none (trust.refusal)."""
    secrets_ = tuple(sorted(inp.SECRETS & {i.name for i in table}))
    env = (*names.OBJECT_STORE_ENV, *names.OIDC_ENV)
    return StepSpec("admit", "Check what this run was given", secrets_, env)


# What each JavaScript entry point runs, in order (js/fxcache.js asks `describe`).
RUNS: dict[str, Run] = {
    "main": Run(
        inp.MAIN,
        (
            _admit(inp.MAIN),
            StepSpec(
                "setup",
                "Check the inputs and decide trust",
                ("redis-url",),
                ("GITHUB_STATE",),
                (names.SETTINGS_ENV,),
            ),
            StepSpec(
                "restore",
                "Restore the cache",
                ("signing-key", "redis-url"),
                (*names.OBJECT_STORE_ENV, *names.CACHE_SERVICE_ENV),
            ),
            StepSpec("verify", "Verify hot loads", ("redis-url",)),
            StepSpec("report", "Report"),
            StepSpec("comment", "Comment on the pull request", ("github-token",)),
            StepSpec("conclude", "Fail on the verdicts (fail-on)"),
        ),
        keep_for_post=names.LOADER_PATH_ENV,
    ),
    "post": Run(
        inp.MAIN,
        (
            _admit(inp.MAIN),
            StepSpec(
                "post-save",
                "Save the cache (end of job)",
                ("signing-key",),
                (
                    *names.CACHE_SERVICE_ENV,
                    *names.OBJECT_STORE_ENV,
                    f"STATE_{SETTINGS_STATE}",
                    f"STATE_{DIGEST_STATE}",
                ),
            ),
            StepSpec(
                "post-comment",
                "Add the job's own compiles to the pull-request comment",
                ("github-token",),
                (f"STATE_{SETTINGS_STATE}", f"STATE_{DIGEST_STATE}"),
            ),
        ),
        withheld=(names.LOADER_PREFIX,),
        from_main=names.LOADER_PATH_ENV,
    ),
    "save": Run(
        inp.SAVE,
        (
            _admit(inp.SAVE),
            StepSpec(
                "save",
                "Save the cache",
                ("signing-key",),
                (*names.CACHE_SERVICE_ENV, *names.OBJECT_STORE_ENV),
            ),
        ),
        withheld=names.LOADER_INJECTION_ENV,
    ),
    "invalidate": Run(
        inp.INVALIDATE,
        (
            _admit(inp.INVALIDATE),
            StepSpec(
                "invalidate",
                "Invalidate",
                ("redis-url", "github-token"),
                names.OBJECT_STORE_ENV,  # target s3 / object: the bucket's credentials
            ),
        ),
    ),
}


def describe(run_name: str) -> dict[str, Any]:
    """The steps of one JavaScript entry point and what each may see (JSON for js/)."""
    if run_name not in RUNS:
        raise UsageError(f"unknown action run {run_name!r}: one of {', '.join(RUNS)}")
    run_ = RUNS[run_name]
    return {
        "inputs": [i.name for i in run_.inputs],
        "secret_inputs": sorted(inp.SECRETS & {i.name for i in run_.inputs}),
        "private_env": list(PRIVATE_ENV),
        "withheld_prefixes": list(run_.withheld),
        "keep_for_post": list(run_.keep_for_post),
        "from_main": list(run_.from_main),
        "steps": [
            {
                "step": s.step,
                "title": s.title,
                "secrets": list(s.secrets),
                "env": list(s.env),
                "passes": [names.check_passable(n) for n in s.passes],
            }
            for s in run_.steps
        ],
    }


def admit() -> int:
    """Refuse the run, before anything else runs, when it may execute code the repository did
    not review and was given a secret (trust.refusal: one ::error:: line, exit 2)."""
    values = inp.from_env(inp.MAIN, inp.SAVE, inp.INVALIDATE)
    given = {name: values[name] for name in inp.SECRETS if name in values}
    why = trust.refusal(values["run-event"], trust.given_secrets(given, os.environ))
    if why is not None:
        raise UsageError(why)
    return 0


def store_policy_of(values: dict[str, Any], *, read_only: bool, upload: bool) -> StorePolicy:
    """The store policy (factory.store_policy, as `fxcache restore` decides it from its flags)
    from the inputs: `upload` is whether this run may write the remote tier."""
    return store_policy(values["store"], s3_url=values["s3-url"] or None,
                        redis_url=values["redis-url"] or None, key_suffix=values["key-suffix"],
                        read_only=read_only, may_write_remote=upload,
                        object_url=values["object-url"] or None)  # fmt: skip


def _root(store: str, cache_root: str, read_only: bool, upload: bool) -> Path:
    """The store root of this run (a warning when the input's is not writable)."""
    if store == "github" and read_only:
        # A read-only run never unpacks a GitHub cache entry (which an untrusted run can fill
        # itself) into the runner's shared store: it restores from a private root.
        root = runner_temp() / "fxcache-read-only-store"
        root.mkdir(parents=True, exist_ok=True)
        return root
    root, problem = store_root(cache_root)
    if problem:
        gha.warn(problem)
    if store in ("github", "s3", "object") and not read_only:
        # What a run that may not write the remote commits stays in its own namespace.
        root = trust_root(root, may_write_remote=upload)
    return root


def _work_dir(report_id: str, number: int | None) -> Path:
    work = runner_temp() / "fxcache" / report_id
    work.mkdir(parents=True, exist_ok=True)
    if number is not None:  # for the fork follow-up workflow (it uploads this directory)
        (work / "pr-number").write_text(f"{number}\n", encoding="utf-8")
    return work


def _decide(values: dict[str, Any]) -> Settings:
    """Every decision of the job from its checked inputs and the runner's record of the
    event: trust, the store (once), the root, comments, the nonce."""
    event: trust.RunEvent = values["run-event"]
    untrusted = trust.unreviewed_code(event)
    fork = trust.fork_reason(event) if event.name.startswith("pull_request") else None
    read_only = values["read-only"] == "true" or untrusted is not None
    store = values["store"]
    upload = remote_write_decision(values["save"], store, read_only, event)
    root = _root(store, values["cache-root"], read_only, upload)
    python = values["python"] or "python3"
    policy = store_policy_of(values, read_only=read_only, upload=upload)
    notes = list(policy.notes)
    for note in notes:
        gha.say("notice", note)
    return Settings(
        report_id=values["report-id"], python=python, fxcache=fxcache_executable(),
        store=store, choice=policy.choice, remote=policy.choice.kind in ("redis", "s3", "object"),
        root=str(root),
        work=str(_work_dir(values["report-id"], event.number)), read_only=read_only,
        untrusted=untrusted, comment=comment_decision(values["comment"], event.name, fork,
                                                      event.number),
        save=values["save"], timeout_s=max(1, round(values["timeout-minutes"] * 60)),
        notes=notes, nonce=secrets.token_hex(16),
    )  # fmt: skip


def setup() -> int:
    """Check every input (and the verification matrix) before anything is touched, decide
    trust and defaults, write the settings file and the step outputs."""
    from ci_fxcache.fleet import plan

    values = inp.from_env(inp.MAIN)
    axes = {axis: values[name] or None for name, axis in inp.MATRIX_AXES.items()}
    plan.combos(axes, values["matrix-file"] or None)
    settings = _decide(values)
    digest = settings.write()
    path = settings.path
    # Runner-held, for the post step: it acts only on the settings exactly as written here.
    gha.save_state(TOOLKIT_STATE, settings.fxcache)
    gha.save_state(SETTINGS_STATE, str(path))
    gha.save_state(DIGEST_STATE, digest)
    gha.set_output("settings", str(path))
    # For the later steps of this run (steps.RUNS: setup passes it on), the save sub-action
    # and the job's own fxcache commands.
    gha.export_env(names.SETTINGS_ENV, str(path))
    gha.export_env(names.PYTHON_ENV, settings.python)  # later fxcache commands serve it too
    print(
        f"fxcache: store {settings.store} at {settings.root}, read-only "
        f"{str(settings.read_only).lower()}"
        + (f" ({settings.untrusted})" if settings.untrusted else "")
        + f", comment {str(settings.comment).lower()}, remote cache "
        f"{str(settings.remote).lower()}"
    )
    return 0


def verify() -> int:
    """`fxcache verify`; a failed fail-on check is kept for the last step, so that the report
    and the comment are still written."""
    from ci_fxcache.commands import verify as verify_command
    from ci_fxcache.store.layout import VERIFY_DIR_ENV

    values = inp.from_env(inp.MAIN)
    s = load()
    cache_dir = os.environ.get(VERIFY_DIR_ENV) or None
    cache_state = os.environ.get(state_file.STATE_FILE_ENV) or None
    if s.state_file.is_file():
        state = state_file.read_state(s.state_file, Path(s.root))
        cache_dir, cache_state = str(state.verify_dir), str(s.state_file)
    axes = {axis: values[name] or None for name, axis in inp.MATRIX_AXES.items()}
    speedup = values["min-speedup"]
    redis_url = values["redis-url"] if s.choice.kind == "redis" else None
    rc = verify_command.run(verify_command.Request(
        python=s.python, **axes, matrix_file=values["matrix-file"] or None, phase="auto",
        cache_dir=cache_dir, json_path=str(s.results),
        min_speedup=None if speedup is None else float(speedup), compare="bitwise",
        fail_on=values["fail-on"], timeout=float(s.timeout_s), jobs=None,
        recheck_all=os.environ.get(verify_command.RECHECK_ALL_ENV) == "1",
        separate_cold=os.environ.get(verify_command.SEPARATE_COLD_ENV) == "1", deterministic=False,
        cache_state=cache_state, redis_url=redis_url, report_id=s.report_id, salt=None,
    ))  # fmt: skip
    if rc == EXIT_CHECK_FAILED and s.results.is_file():
        job_record.update(Path(s.work), verify_rc=rc)
        rc = 0
    if rc == 0:
        gha.set_output("report-json", str(s.results))
    return rc


def report() -> int:
    """Render the report (summary, outputs); on unsafe combinations disable the caches for
    the rest of the job unless `on-unsafe: keep`."""
    values = inp.from_env(inp.MAIN)
    s = load()
    from ci_fxcache.commands import report as report_command

    rc = report_command.run(
        results=str(s.results), output_format="md", template=None, output=str(s.markdown),
        max_chars=None,
    )  # fmt: skip
    if rc:
        return rc
    summary = json.loads(s.results.read_text(encoding="utf-8")).get("summary", {})
    unsafe = int(summary.get("unsafe", 0))
    if unsafe and values["on-unsafe"] == "keep":
        gha.warn(f"{unsafe} declared combination(s) unsafe; caches stay enabled (on-unsafe: keep)")
    elif unsafe:
        gha.export_env("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
        gha.warn(
            f"{unsafe} declared combination(s) unsafe; Inductor caches are disabled for the rest "
            "of this job (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1)"
        )
    return 0


def post_comment() -> int:
    """The sticky pull-request comment, when setup decided so."""
    values = inp.from_env(inp.MAIN)
    s = load()
    if not s.comment:
        print("fxcache: no pull-request comment for this run")
        return 0
    from ci_fxcache.report import pr_comment

    return pr_comment.post(
        results=str(s.results), report_id=s.report_id, token_env=names.TOKEN_ENV,
        pr=values["run-event"].number,  # the runner's record, not the event file
        repo=None, author=None, from_artifact=None, template=None, job_stats=None,
        token=values["github-token"] or None,
    )  # fmt: skip


def post_job_comment() -> int:
    """At the end of the job: the sticky comment again, with the job's own compiles under its
    status (when setup decided on a comment and the save kept the job's figures). A failure is
    a warning: the job's result stands."""
    if not os.environ.get(f"STATE_{SETTINGS_STATE}"):
        return 0
    values = inp.from_env(inp.MAIN)
    s = load(post=True)
    figures = job_compiles.figures_file(s)
    if not (s.comment and figures.is_file() and s.results.is_file()):
        return 0
    from ci_fxcache.errors import FxcacheError
    from ci_fxcache.report import pr_comment

    try:
        rc = pr_comment.post(
            results=str(s.results), report_id=s.report_id, token_env=names.TOKEN_ENV,
            pr=values["run-event"].number, repo=None, author=None, from_artifact=None,
            template=None, job_stats=str(figures), token=values["github-token"] or None,
        )  # fmt: skip
    except FxcacheError as exc:
        gha.say("error", str(exc))
        rc = exc.exit_code
    if rc != 0:
        gha.warn("the pull-request comment was not updated with the job's own compiles")
    return 0


def conclude() -> int:
    """Fail the step when verify's fail-on check failed (verify said why, once)."""
    s = load()
    rc = job_record.JobRecord.read(Path(s.work)).verify_rc
    if not rc:
        return 0
    print("fxcache: failing: the verification did not pass fail-on (see the error above)")
    return rc


def write_refusal(s: Settings, event: trust.RunEvent) -> str | None:
    """Why this job must not write the store, from setup's settings and the runner's own
    record of the event (this step's `run-event` input; never the $GITHUB_EVENT_PATH file
    or the restore state file, which the job can rewrite); None when it may."""
    if s.read_only:
        return f"read-only run ({s.untrusted or 'read-only: true'})"
    untrusted = trust.unreviewed_code(event)
    if untrusted is not None:
        return f"read-only run ({untrusted})"
    if s.save == "never":
        return "save: never"
    return None


def _job_state(s: Settings, key: str | None, saving: bool) -> state_file.RestoreState | None:
    """This job's restore state (None: the action stopped before restoring). For a run that
    saves: checked with the signing key and bound to this job's setup by its nonce (UsageError
    when not); otherwise, only for the job's figures, None when it cannot be used."""
    if not s.state_file.is_file():
        return None
    try:
        state = state_file.read_state(s.state_file, Path(s.root), key)
    except UsageError:
        if saving:
            raise
        return None
    if saving and state.nonce != s.nonce:
        raise UsageError(
            f"{s.state_file} was not written by this job's restore (its nonce is not "
            "setup's): not saving"
        )
    return state


def _save(
    s: Settings, state: state_file.RestoreState | None, key: str | None, refusal: str | None
) -> tiered.Saved:
    """The save `fxcache save` makes (tiered.save), with setup's store choice: the GitHub
    tier and the bucket get the manifest this save committed, never a re-read of the disk."""
    if refusal is not None:
        return tiered.not_saved(refusal)
    if state is None:
        return tiered.not_saved("the fxcache action stopped before restoring")
    return tiered.save(state, root=Path(s.root), choice=s.choice, signing_key=key)


def _say_remote(s: Settings, outcome: tiered.Saved) -> None:
    """The remote tier's line of the save, in the action's words."""
    sent = outcome.remote
    if not outcome.saved or not s.choice.has_tier:
        return
    if s.choice.kind in ("s3", "object") and not s.upload:
        print("fxcache: not writing the bucket: the save policy does not publish this run")
    elif s.choice.kind == "github" and not s.upload:
        print("fxcache: no new GitHub cache entry: the save policy does not upload this run")
    elif s.choice.kind == "github" and sent is not None and sent.get("published"):
        print(f"fxcache: GitHub cache entry {sent.get('key')} saved "
              f"({sent.get('bytes', 0)} bytes)")  # fmt: skip
    elif s.choice.kind == "github" and sent is not None and "reason" in sent:
        print(f"fxcache: no new GitHub cache entry: {sent['reason']}")


def save(post: bool = False) -> int:
    """Commit the restored scope (save sub-action, or the end-of-job save with `post`), once
    per job, through the one save (tiered.save, as `fxcache save`); outputs `saved` and the
    job's cache stats (job_stats). Trust comes from setup's settings (for `post`, exactly as
    setup wrote them) and the event; the signing key from this step's inputs."""
    if post and not os.environ.get(f"STATE_{SETTINGS_STATE}"):
        print("fxcache: end-of-job save: the fxcache action did not set up (nothing to save)")
        return 0
    values = inp.from_env(inp.MAIN if post else inp.SAVE)
    key = values["signing-key"] or None
    s = load(post=post)
    # A marker, not a message: the end-of-job save runs in the post step, another process,
    # after a save sub-action may have committed this job's scope (its lease released, its
    # overlay merged and removed); the job is saved once, so the post step must know that.
    work = Path(s.work)
    done = job_record.JobRecord.read(work).saved
    if done is not None:
        print(f"fxcache: already saved in this job (saved: {str(done).lower()})")
        return 0
    refusal = write_refusal(s, values["run-event"])
    state = _job_state(s, key, saving=refusal is None)
    compiles = job_compiles.at_save(s, state, refusal is None, key)
    started = time.monotonic()
    outcome = _save(s, state, key, refusal)
    record = job_record.update(
        work, save_s=round(time.monotonic() - started, 3), saved=outcome.saved
    )
    _say_remote(s, outcome)
    print(json.dumps(outcome.summary, indent=2))
    gha.set_output("saved", str(outcome.saved).lower())
    # the new entries' figures from the manifest this save committed, not a re-read of the disk
    job_stats.publish(job_stats.compute(outcome, record.timings), s.job_stats)
    job_compiles.publish(compiles, s.results)
    return 0


def invalidate() -> int:
    """The invalidate sub-action: the typed call `fxcache invalidate --json` makes, its JSON
    printed and kept in a file; the URLs and the token passed as arguments."""
    from ci_fxcache.commands import invalidate as invalidate_command
    from ci_fxcache.report import invalidation

    values = inp.from_env(inp.INVALIDATE)
    keep = values["keep-latest"] or None
    if keep is not None and not keep.isdigit():
        raise UsageError(f"input keep-latest: {keep!r} is not a whole number")
    policy = invalidate_command.policy(
        os.environ.get(names.PYTHON_ENV) or "python3", values["max-age"] or None,
        values["max-size"] or None, None if keep is None else int(keep),
        values["older-torch-than"] or None,
    )  # fmt: skip
    result, rc = invalidate_command.invalidate(
        stores=[values["target"]], policy=policy, dry_run=bool(values["dry-run"]),
        root=Path(values["cache-root"]) if values["cache-root"] else None,
        urls={"redis": values["redis-url"] or None, "s3": values["s3-url"] or None,
              "object": values["object-url"] or None},
        github_token=values["github-token"] or None,
    )  # fmt: skip
    text = json.dumps(result, indent=2) + "\n"
    print(text, end="")
    out = runner_temp() / "fxcache" / f"invalidate-{values['target']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    gha.set_output("report-json", str(out))
    gha.append_summary(invalidation.markdown(result))
    return rc


STEPS: dict[str, Callable[[], int]] = {
    "admit": admit,
    "setup": setup,
    "restore": restore_step.restore,
    "verify": verify,
    "report": report,
    "comment": post_comment,
    "conclude": conclude,
    "save": save,
    "post-save": lambda: save(post=True),
    "post-comment": post_job_comment,
    "invalidate": invalidate,
}


def run(step: str, what: str | None = None) -> int:
    """Run one step (`describe` prints what a JavaScript entry point `what` runs);
    UsageError for an unknown one."""
    if step == "describe":
        print(json.dumps(describe(what or "")))
        return 0
    if step not in STEPS:
        raise UsageError(f"unknown action step {step!r}")
    return STEPS[step]()
