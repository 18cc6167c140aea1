"""Is this Actions run allowed to write the shared store?

Untrusted (read-only automatically): `pull_request*` events whose head repository is a fork,
and `pull_request_target` / `issue_comment` / `workflow_run` events, which run with a read-only
cache token on GitHub and may be driven by code or text from outside the repository.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ci_fxcache import gha

UNTRUSTED_EVENTS = frozenset({"pull_request_target", "issue_comment", "workflow_run"})


def untrusted_reason() -> str | None:
    """Why this run must restore read-only, or None when it may write (or is not in Actions)."""
    if not gha.in_actions():
        return None
    event = os.environ.get("GITHUB_EVENT_NAME", "")
    if event in UNTRUSTED_EVENTS:
        return f"{event} event"
    if not event.startswith("pull_request"):
        return None
    path = os.environ.get("GITHUB_EVENT_PATH", "")
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
        pr = payload["pull_request"]
        head, base = pr["head"]["repo"], pr["base"]["repo"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{event} event whose payload cannot be read (GITHUB_EVENT_PATH)"
    if head is None:  # the fork was deleted
        return "pull request from a deleted fork"
    if head.get("fork") or head.get("full_name") != base.get("full_name"):
        return f"pull request from fork {head.get('full_name')}"
    return None
