"""GitHub Actions caches: list, decide by policy, delete (built on ci_fxcache.github_api)."""

from __future__ import annotations

from typing import Any

from ci_fxcache.errors import UsageError
from ci_fxcache.store.policies import Policy


def run(policy: Policy, dry_run: bool) -> list[dict[str, Any]]:
    """Placeholder until the shared GitHub client lands on main."""
    raise UsageError("--github is not available yet")
