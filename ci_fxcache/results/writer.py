"""The results document (`fxcache-results/2`, docs/contracts.md): built once, rendered later."""

from __future__ import annotations

import json
import os
import platform
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ci_fxcache import __version__, timestamps, userfiles
from ci_fxcache.results.reader import RESULTS_SCHEMA as SCHEMA
from ci_fxcache.verify import causes

SCHEMA_FILE = Path(__file__).resolve().parent / "results.schema.json"


# The Actions variables that name the commit and the run (the report's status line links them).
CI_VARIABLES = {
    "sha": "GITHUB_SHA",
    "server_url": "GITHUB_SERVER_URL",
    "repository": "GITHUB_REPOSITORY",
    "run_id": "GITHUB_RUN_ID",
    "run_number": "GITHUB_RUN_NUMBER",
}
CI_PATTERNS = {  # as results.schema.json says; the report builds links only from these
    "sha": re.compile(r"[0-9a-f]{7,64}"),
    "server_url": re.compile(r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?"),
    "repository": re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+"),
    "run_id": re.compile(r"[0-9]{1,20}"),
    "run_number": re.compile(r"[0-9]{1,20}"),
}


def ci_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The commit and run of this GitHub Actions job (`ci` in the results), None outside one.
    A value that does not look exactly like GitHub's is left out (the schema's patterns)."""
    env = os.environ if environ is None else environ
    found = {
        name: env[var].strip().rstrip("/") if name == "server_url" else env[var].strip()
        for name, var in CI_VARIABLES.items()
        if env.get(var)
    }
    kept = {k: v for k, v in found.items() if CI_PATTERNS[k].fullmatch(v)}
    return kept or None


def document(
    *,
    fingerprint: dict[str, Any] | None,
    scope_key: str | None,
    cache: Any,
    settings: dict[str, Any],
    matrix: dict[str, Any],
    combos: list[dict[str, Any]],
    report_id: str = "fxcache",
) -> dict[str, Any]:
    """The whole document."""
    return {
        "schema": SCHEMA,
        "fxcache_version": __version__,
        "created_at": timestamps.utc_now(),
        "report_id": report_id,
        "runner": {
            "name": os.environ.get("RUNNER_NAME") or platform.node(),
            "os": platform.system().lower(),
        },
        "ci": ci_from_env(),
        "fingerprint": fingerprint,
        "scope_key": scope_key,
        "cache": cache,
        "settings": settings,
        "matrix": matrix,
        "combos": combos,
        "summary": causes.summary(combos),
    }


def write(doc: dict[str, Any], path: str) -> None:
    """Write the document (`-` = stdout), atomically for files."""
    text = json.dumps(doc, indent=2) + "\n"
    if path == "-":
        print(text, end="")
        return
    userfiles.write_output(path, text, "--json", make_parents=True)
