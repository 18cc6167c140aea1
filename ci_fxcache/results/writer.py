"""The results document (`fxcache-results/2`, docs/contracts.md): built once, rendered later."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from ci_fxcache import __version__, timestamps, userfiles
from ci_fxcache.results.reader import RESULTS_SCHEMA as SCHEMA
from ci_fxcache.verify import causes

SCHEMA_FILE = Path(__file__).resolve().parent / "results.schema.json"


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
