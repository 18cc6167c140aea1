"""`fxcache action setup`: from the checked inputs and the event, every decision of the job.

Trust (read-only, remote cache writes, comments), the store root and its fallback, the work
directory, the GitHub cache keys and the save policy are resolved once here and written to a
settings file that every later step (and the save sub-action or the end-of-job save) reads.
Secrets are never written to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ci_fxcache import gha, names
from ci_fxcache.errors import UsageError
from ci_fxcache.store.layout import default_root
from ci_fxcache.store.remote.factory import StoreChoice
from ci_fxcache.store.trust import RunEvent

# Runner-held state of the action's main step, handed to its post step only (STATE_<name>):
# where setup's settings are and their sha256 when setup wrote them.
SETTINGS_STATE = "fxcache_settings"
TOOLKIT_STATE = "fxcache_toolkit"  # the toolkit main ran, which the post step runs (js/)
DIGEST_STATE = "fxcache_settings_sha256"
SCHEMA = "fxcache-action-settings/2"
PULL_REQUEST_EVENTS = ("pull_request", "pull_request_target")
SAVE_EVENTS = ("push", "schedule")


@dataclass
class Settings:
    """What setup decided; JSON in `<work>/settings.json`."""

    report_id: str
    python: str
    fxcache: str
    store: str  # the `store` input (js/ installs its extra from it)
    choice: StoreChoice  # the store this run uses, decided once (factory.choose)
    remote: bool  # Redis remote cache on (store redis, URL, trusted), or the S3 tier (URL)
    root: str
    work: str
    read_only: bool
    untrusted: str | None
    comment: bool
    save: str
    timeout_s: int
    notes: list[str] = field(default_factory=list)
    nonce: str = ""  # this job's setup; restore records it in its state file
    schema: str = SCHEMA

    @property
    def upload(self) -> bool:
        """Store github or s3: this run may write the remote tier."""
        return self.choice.has_tier and self.choice.may_write_remote

    @property
    def state_file(self) -> Path:
        return Path(self.work) / "restore-state.json"

    @property
    def results(self) -> Path:
        return Path(self.work) / "results.json"

    @property
    def markdown(self) -> Path:
        return Path(self.work) / "report.md"

    @property
    def job_stats(self) -> Path:
        return Path(self.work) / "job-stats.json"

    @property
    def path(self) -> Path:
        return Path(self.work) / "settings.json"

    def write(self) -> str:
        """Write the settings file; its sha256 (the post step checks it)."""
        data = (json.dumps(asdict(self), indent=2) + "\n").encode()
        self.path.write_bytes(data)
        return hashlib.sha256(data).hexdigest()


def load(path: str | None = None, post: bool = False) -> Settings:
    """The settings setup wrote (`path`, else $FXCACHE_ACTION_SETTINGS); UsageError if none.
    With `post` (the action's own post step), the path and the sha256 come from the main
    step's runner-held state, and a file changed since setup wrote it is refused."""
    expected = None
    where = path or os.environ.get(names.SETTINGS_ENV, "")
    if post:
        where = os.environ.get(f"STATE_{SETTINGS_STATE}", "")
        expected = os.environ.get(f"STATE_{DIGEST_STATE}", "")
    if not where:
        raise UsageError(
            "no fxcache settings in this job: run the fxcache action earlier in the job"
        )
    try:
        raw = Path(where).read_bytes()
        if expected is not None and hashlib.sha256(raw).hexdigest() != expected:
            raise UsageError(
                f"fxcache settings {where} changed after setup wrote them: not acting on them"
            )
        data = json.loads(raw)
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}")
        return Settings(**{**data, "choice": StoreChoice(**data["choice"])})
    except (OSError, ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise UsageError(f"unreadable fxcache settings {where}: {exc}") from None


def runner_temp() -> Path:
    """$RUNNER_TEMP (emptied after every job), else the system's temporary directory."""
    return Path(os.environ.get("RUNNER_TEMP") or tempfile.gettempdir())


def writable_problem(path: Path) -> str | None:
    """None when `path` is (or can be made) a directory we can write, else why not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fxcache-probe-"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def store_root(cache_root: str) -> tuple[Path, str | None]:
    """The store root (the input, else the default) and, when it is not writable, a fallback
    under $RUNNER_TEMP with the warning to give."""
    root = Path(cache_root).expanduser() if cache_root else default_root()
    problem = writable_problem(root)
    if problem is None:
        return root.absolute(), None
    fallback = runner_temp() / "fxcache-store"
    again = writable_problem(fallback)
    if again is not None:
        raise UsageError(f"neither {root} ({problem}) nor {fallback} ({again}) is writable")
    return fallback.absolute(), (
        f"cache root {root} is not writable ({problem}); using {fallback} for this job "
        "(nothing is kept for later jobs: set cache-root to a writable directory)"
    )


def comment_decision(choice: str, event: str, fork: str | None, number: int | None) -> bool:
    """Comment on the pull request? `auto`: on pull requests whose token can write."""
    if choice != "auto":
        return choice == "true"
    if event not in PULL_REQUEST_EVENTS or number is None:
        return False
    if event == "pull_request" and fork:
        gha.say(
            "notice",
            "pull request from a fork: its token cannot comment; the fxcache-comment-fork "
            "workflow posts the report",
        )
        return False
    return True


def remote_write_decision(save: str, store: str, read_only: bool, event: RunEvent) -> bool:
    """May this run write the remote tier (a new GitHub cache entry, the S3 bucket)? Never
    when read-only or `save: never`; `always`: every trusted run; `auto`: push and schedule
    runs on the default branch only, so that a branch nobody reviewed yet (a pull request's,
    same repository included) never writes what the default branch reads. GitHub keeps a
    pull request's own entries to that pull request anyway; for S3 this is fxcache's own
    choice, and only credentials that cannot write (docs/security.md) bind the job's code."""
    if store not in ("github", "s3", "object") or read_only or save == "never":
        return False
    if save == "always":
        return True
    branch = event.default_branch
    return (
        event.name in SAVE_EVENTS
        and bool(branch)
        and os.environ.get("GITHUB_REF") == (f"refs/heads/{branch}")
    )


def fxcache_executable() -> str:
    """This toolkit's `fxcache` (for the end-of-job save, which has no step outputs)."""
    exe = Path(sys.executable).with_name("fxcache")
    return str(exe if exe.exists() else Path(sys.argv[0]).absolute())
