"""Is this Actions run allowed to write the shared store, and with which key are manifests
signed? The one place that decides.

Untrusted (read-only automatically): `pull_request*` events whose head repository is not the
base repository (a fork), and `pull_request_target` / `issue_comment` / `workflow_run` events,
which run with a read-only cache token on GitHub and may be driven by code or text from
outside the repository.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ci_fxcache import gha

# Their home is ci_fxcache/secret_env.py (a helper, so that env/ may use them too).
from ci_fxcache.secret_env import SECRET_ENV, SIGNING_ENV, without_secrets  # noqa: F401

UNTRUSTED_EVENTS = frozenset({"pull_request_target", "issue_comment", "workflow_run"})


def event_payload() -> dict[str, Any] | None:
    """The current event's payload ($GITHUB_EVENT_PATH), or None when absent or unreadable."""
    path = os.environ.get("GITHUB_EVENT_PATH", "")
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def fork_reason(payload: dict[str, Any] | None) -> str | None:
    """Why this pull request payload comes from a fork, or None when head and base are one
    repository. Repository ids decide (names change on renames and transfers); the head
    repository's own `fork` flag does not: a repository that is itself a fork (acme/vllm)
    opens pull requests from its own branches."""
    try:
        pr = (payload or {})["pull_request"]
        head, base = pr["head"]["repo"], pr["base"]["repo"]
    except (KeyError, TypeError):
        return "pull request whose payload cannot be read (GITHUB_EVENT_PATH)"
    if not isinstance(head, dict):  # the fork was deleted
        return "pull request from a deleted fork"
    if not isinstance(base, dict):
        return "pull request whose base repository cannot be read"
    head_id, base_id = head.get("id"), base.get("id")
    if isinstance(head_id, int) and isinstance(base_id, int):
        same = head_id == base_id
    else:
        same = bool(head.get("full_name")) and head.get("full_name") == base.get("full_name")
    return None if same else f"pull request from fork {head.get('full_name')}"


def untrusted_reason() -> str | None:
    """Why this run must restore read-only, or None when it may write (or is not in Actions)."""
    if not gha.in_actions():
        return None
    event = os.environ.get("GITHUB_EVENT_NAME", "")
    if event in UNTRUSTED_EVENTS:
        return f"{event} event"
    if not event.startswith("pull_request"):
        return None
    return fork_reason(event_payload())


def signing_key() -> str | None:
    """The HMAC key from FXCACHE_SIGNING_KEY (masked in Actions logs), or None."""
    key = os.environ.get(SIGNING_ENV) or None
    if key:
        gha.mask(key)
    return key
