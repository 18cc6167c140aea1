"""What a run may do, decided in one place: whether it may run beside a secret, whether it may
write the shared store, and with which key manifests are signed.

What a run is comes from its event. Inside the action that is the runner's own record of it
(`RunEvent.from_input`: the `run-event` input, which the runner fills from its `github`
context, and `$GITHUB_EVENT_NAME`, which no step can change); no step of the job can rewrite
either. The `$GITHUB_EVENT_PATH` file, which any step of the job can rewrite, is read only by
the command line run from a job's own steps (`from_environment`).

One rule (`unreviewed_code`): a run may execute code the repository did not review when its
event is `pull_request_target`, `issue_comment` or `workflow_run` (the base repository's
workflow, secrets and token, driven by someone outside it; fxcache cannot see what the job
checked out, so it assumes the pull request's code), a pull request whose head repository
is not the base repository (a fork), or any event not in ADMITTED_EVENTS (an allowlist: what
fxcache does not know, such as `issues`, `watch` or `fork`, which anyone can start, counts as
outside). Such a run restores read-only and never writes, and the action refuses to start in
it when it was given a secret (`refusal`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_fxcache import gha, names
from ci_fxcache.errors import UsageError
from ci_fxcache.store import manifest

UNTRUSTED_EVENTS = frozenset({"pull_request_target", "issue_comment", "workflow_run"})
# Events whose runs only the repository's writers (or its schedule) start, and the pull
# request events, whose runs are trusted unless they come from a fork (fork_reason): the
# only events a run may hold a secret in. Anything else is refused with a secret.
PULL_REQUEST_EVENTS = frozenset(
    {"pull_request", "pull_request_review", "pull_request_review_comment"}
)
ADMITTED_EVENTS = frozenset(
    {"push", "schedule", "workflow_dispatch", "merge_group", "release", "create", "delete",
     "deployment", "deployment_status", "repository_dispatch", *PULL_REQUEST_EVENTS}
)  # fmt: skip
FORK_COMMENT_WORKFLOW = "workflows/fxcache-comment-fork.yml"


@dataclass(frozen=True)
class RunEvent:
    """The facts of a run's event that trust needs (pull request fields are None elsewhere)."""

    name: str
    number: int | None = None
    head_repo_id: int | None = None
    base_repo_id: int | None = None
    head_repo: str | None = None  # for messages only: names change on renames
    base_repo: str | None = None
    default_branch: str | None = None
    head_deleted: bool = False  # a pull request whose fork was deleted

    @classmethod
    def from_input(cls, text: str, event_name: str) -> RunEvent:
        """The action's `run-event` input: JSON the runner built from its github context
        (action.yml's default). UsageError when it is not that, or names another event than
        the runner's $GITHUB_EVENT_NAME (`event_name`)."""
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("event_name"), str):
            raise UsageError(
                "input run-event is not the runner's record of the event: leave it unset "
                "(its default is filled in by the runner)"
            )
        if event_name and data["event_name"] != event_name:
            raise UsageError(
                f"input run-event names event {data['event_name']!r}, the runner says "
                f"{event_name!r}: leave run-event unset"
            )

        def integer(name: str) -> int | None:
            value = data.get(name)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def string(name: str) -> str | None:
            value = data.get(name)
            return value if isinstance(value, str) and value else None

        head_id, head = integer("head_repo_id"), string("head_repo")
        return cls(
            name=data["event_name"],
            number=integer("number"),
            head_repo_id=head_id,
            base_repo_id=integer("base_repo_id"),
            head_repo=head,
            base_repo=string("base_repo"),
            default_branch=string("default_branch"),
            head_deleted=data["event_name"].startswith("pull_request")
            and head_id is None
            and head is None,
        )

    @classmethod
    def from_payload(cls, name: str, payload: Mapping[str, Any] | None) -> RunEvent:
        """From an event payload as `$GITHUB_EVENT_PATH` holds it (the command line's way)."""
        payload = payload or {}
        pr = payload.get("pull_request")
        if not isinstance(pr, dict):
            pr = {}

        def repo(side: str) -> dict[str, Any] | None:
            part = pr.get(side)
            value = part.get("repo") if isinstance(part, dict) else None
            return value if isinstance(value, dict) else None

        head, base = repo("head"), repo("base")
        number = pr.get("number")

        def ident(r: dict[str, Any] | None) -> int | None:
            value = (r or {}).get("id")
            return value if isinstance(value, int) else None

        repository = payload.get("repository")
        branch = repository.get("default_branch") if isinstance(repository, dict) else None
        return cls(
            name=name,
            number=number if isinstance(number, int) else None,
            head_repo_id=ident(head),
            base_repo_id=ident(base),
            head_repo=(head or {}).get("full_name"),
            base_repo=(base or {}).get("full_name"),
            default_branch=branch if isinstance(branch, str) else None,
            head_deleted=bool(pr) and head is None,
        )


def event_payload() -> dict[str, Any] | None:
    """The current event's payload ($GITHUB_EVENT_PATH), or None when absent or unreadable.
    Any step of the job can rewrite that file: the action never decides trust from it."""
    path = os.environ.get("GITHUB_EVENT_PATH", "")
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def from_environment() -> RunEvent | None:
    """The command line's view of the run (None outside Actions, or where no event is
    named: the runner always names one): $GITHUB_EVENT_NAME and the payload file."""
    name = os.environ.get("GITHUB_EVENT_NAME", "")
    if not gha.in_actions() or not name:
        return None
    return RunEvent.from_payload(name, event_payload())


def fork_reason(event: RunEvent) -> str | None:
    """Why this pull request comes from a fork, or None when head and base are one
    repository. Repository ids decide (names change on renames and transfers); the head
    repository's own `fork` flag does not: a repository that is itself a fork (acme/vllm)
    opens pull requests from its own branches."""
    if event.head_deleted:
        return "pull request from a deleted fork"
    if event.head_repo_id is not None and event.base_repo_id is not None:
        same = event.head_repo_id == event.base_repo_id
    elif event.head_repo_id is None and event.base_repo_id is None and event.head_repo:
        same = event.head_repo == event.base_repo
    else:
        return "pull request whose repositories cannot be read"
    return None if same else f"pull request from fork {event.head_repo}"


def unreviewed_code(event: RunEvent | None) -> str | None:
    """Why this run may execute code the repository did not review (a fork's workload,
    interpreter or build) while holding what the repository gives its own runs, or None (a
    trusted run, or not in Actions). The one rule: such a run never writes the shared store
    and holds no secret."""
    if event is None:
        return None
    if event.name in UNTRUSTED_EVENTS:
        return f"{event.name} event"
    if event.name in PULL_REQUEST_EVENTS:
        return fork_reason(event)
    if event.name not in ADMITTED_EVENTS:
        return f"{event.name or 'unnamed'} event, which fxcache does not admit"
    return None


def untrusted_reason() -> str | None:
    """The command line's verdict (`fxcache restore` in a job's own step): unreviewed_code of
    the run as the environment and the payload file describe it."""
    return unreviewed_code(from_environment())


def install_reason() -> str | None:
    """Why the toolkit install must not reuse a shared venv (scripts/install-toolkit.sh): the
    run's verdict from the runner's record in $FXCACHE_RUN_EVENT (the action's input), else
    from the environment; a record that cannot be read counts as untrusted."""
    text = os.environ.get("FXCACHE_RUN_EVENT", "")
    if not text:
        return untrusted_reason()
    try:
        event = RunEvent.from_input(text, os.environ.get("GITHUB_EVENT_NAME", ""))
    except UsageError as exc:
        return str(exc)
    return unreviewed_code(event) if gha.in_actions() else None


def given_secrets(inputs: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """What of the secrets the action knows this run was given: the secret inputs that are
    set, and the object-store credentials and OIDC token request in the environment."""
    given = [name for name in sorted(inputs) if inputs[name]]
    given += [name for name in (*names.OBJECT_STORE_ENV, *names.OIDC_ENV) if env.get(name)]
    return given


def refusal(event: RunEvent | None, given: Iterable[str]) -> str | None:
    """Why the action must not start in this run, or None: a run that may execute code the
    repository did not review must hold no secret, since that code, running as the job's
    user, can read every process of the job (the action's own, and its inputs, included). A
    fork's `pull_request` run may keep the GitHub token: GitHub makes it read-only there."""
    why = unreviewed_code(event)
    if why is None or event is None:
        return None
    fork_pull = event.name in PULL_REQUEST_EVENTS
    held = [name for name in given if not (fork_pull and name == "github-token")]
    if not held:
        return None
    if event.name not in ADMITTED_EVENTS | UNTRUSTED_EVENTS:
        return (
            f"event {event.name!r} is not one fxcache admits with secrets (it was given "
            f"{', '.join(held)}): anyone may be able to start its runs. Admitted: "
            f"{', '.join(sorted(ADMITTED_EVENTS))}; run fxcache from one of those, or give "
            "this workflow no secret (it then restores read-only)"
        )
    return (
        f"this run may execute code the repository did not review ({why}), and it was given "
        f"{', '.join(held)}: that code could read them from the job's processes, so fxcache "
        "does not start. Verify in the fork's own pull_request run, which holds no secret "
        "(github-token: '', no signing-key, no store credentials here), and post the comment "
        f"from {FORK_COMMENT_WORKFLOW}"
    )


def sign(doc: dict[str, Any], key: str) -> None:
    """Sign a document kept beside the store (the job history) as a manifest is signed: an
    HMAC-SHA256 of its canonical JSON under `signature`."""
    manifest.sign(doc, key)


def signed_with(doc: dict[str, Any], key: str) -> bool:
    """Whether `doc` carries a valid signature (`sign`) for `key`."""
    return manifest.signature_problem(doc, key) is None


def signing_key() -> str | None:
    """The HMAC key from FXCACHE_SIGNING_KEY (masked in Actions logs), or None."""
    key = os.environ.get(names.SIGNING_ENV) or None
    if key:
        gha.mask(key)
    return key
