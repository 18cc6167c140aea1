"""`fxcache stats`: what the job's own compiles did, at any time (the latest job of the scope,
or the job a restore state file names, also after its save)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.commands import options
from ci_fxcache.errors import UsageError


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the `stats` subcommand."""
    parser = sub.add_parser(
        "stats",
        parents=[parent],
        help="what the job's own torch.compile calls did: hits, misses and why, compile time",
        description="Read the job's structured trace (TORCH_TRACE, set by 'fxcache restore') "
        "and show its FX-graph and AOTAutograd hits, misses (each with its cause: new graph, "
        "key changed with the changed key components, entry gone), bypasses, recompiles, "
        "graph breaks and compile time, with the scope's history. Without a state file "
        "(--state-file or FXCACHE_STATE_FILE): the history of this environment's scope.",
    )
    parser.add_argument(
        "--state-file",
        type=Path,
        default=None,
        help="the restore state of the job to show (default: FXCACHE_STATE_FILE)",
    )
    options.root_option(parser)
    options.python_option(parser)
    parser.add_argument(
        "--json", dest="as_json", action="store_true", help="print fxcache-stats/1 JSON"
    )
    parser.set_defaults(func=run)


def _job(path: Path, root: Path | None) -> dict[str, Any]:
    from ci_fxcache.jobstats import job
    from ci_fxcache.store import state_file, trust

    kept = job.load(path)
    if kept is not None:
        return kept
    state = state_file.read_state(path, root, trust.signing_key())
    return job.public(job.observe(state, path))


def _scope(python: str, root: Path | None) -> dict[str, Any]:
    from ci_fxcache.env import fingerprint, scopekey
    from ci_fxcache.jobstats import history, job
    from ci_fxcache.store.layout import Layout, resolve_root

    key = scopekey.scope_key(fingerprint.collect(python))
    layout = Layout(resolve_root(root))
    scope = layout.scope(key)
    if not scope.is_dir():
        raise UsageError(f"no scope {key} under {scope.parent}: run 'fxcache restore' first")
    rows = history.rows(layout.root, key, scope / "inductor", None)
    return {"schema": job.SCHEMA, "scope_key": key, "history": rows}


def run(*, state_file: Path | None, root: Path | None, python: str, as_json: bool) -> int:
    """Show one job's figures, or the scope's history."""
    from ci_fxcache.report import job_line
    from ci_fxcache.store.state_file import STATE_FILE_ENV

    path = state_file or (
        Path(os.environ[STATE_FILE_ENV]) if os.environ.get(STATE_FILE_ENV) else None
    )
    doc = _job(path, root) if path is not None else _scope(python, root)
    if as_json:
        print(json.dumps(doc, indent=2))
    elif "graphs" in doc:
        gha.print_untrusted(job_line.text(doc))
    else:
        gha.print_untrusted(f"scope {doc['scope_key']}\n" + job_line.history_text(doc["history"]))
    return 0
