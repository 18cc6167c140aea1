"""The variables that carry fxcache's secrets, and an environment without them.

A cross-cutting helper (every stage starts processes: the fingerprint snippet in env/, the
spare-overlay builder in store/, the phases in verify/), so it depends on nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SIGNING_ENV = "FXCACHE_SIGNING_KEY"
# Variables that carry fxcache's secrets (or all of the action's inputs) inside its own
# processes; `without_secrets` keeps them from the processes fxcache starts.
SECRET_ENV = (
    SIGNING_ENV,
    "FXCACHE_INPUTS",
    "FXCACHE_GITHUB_TOKEN",
    "FXCACHE_REDIS_URL",
    "GITHUB_TOKEN",
    "ACTIONS_RUNTIME_TOKEN",
    "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
)


def without_secrets(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) without fxcache's secret variables (SECRET_ENV): the
    environment for a process that runs code fxcache did not write (the user's interpreter)
    or that needs none of them."""
    source = os.environ if env is None else env
    return {k: v for k, v in source.items() if k not in SECRET_ENV}
