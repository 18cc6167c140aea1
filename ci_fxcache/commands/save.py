"""`fxcache save`: commit the scope that `fxcache restore` handed out in place."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ci_fxcache.commands import options
from ci_fxcache.store import trust
from ci_fxcache.store.state_file import saved_state_file


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the `save` subcommand."""
    parser = sub.add_parser(
        "save",
        parents=[parent],
        help="commit the restored scope (manifest, hashes, signature) for later jobs",
        description="Write the scope's manifest atomically under the per-scope lock. Read-only "
        "restores are skipped. A failure to save is a warning, never a failed job.",
    )
    options.root_option(parser)
    options.state_file_option(parser)
    parser.add_argument(
        "--json", dest="as_json", action="store_true", help="print the result as JSON"
    )
    parser.set_defaults(func=run)


def run(*, root: Path | None, state_file: Path | None, as_json: bool) -> int:
    """Save, or say why not."""
    # Here, not at the top: every command imports this module, and the save path (~4 ms of
    # imports) is only needed by this one.
    from ci_fxcache.jobstats.finish import at_save
    from ci_fxcache.store import tiered
    from ci_fxcache.store.state_file import read_state

    path = saved_state_file(state_file)
    key = trust.signing_key()
    state = read_state(path, root, key)
    # Before the save: this job's entry records go into the scope with its entries.
    job = at_save(state, path, may_record=True, signing_key=key)
    result = tiered.save(state, root=root, choice=None, signing_key=key).summary
    if as_json:
        print(json.dumps(result, indent=2))
    elif result["saved"]:
        print(
            f"fxcache: saved {result['scope_key']}: {result['files']} files "
            f"({result['added']} new), {result['bytes']} bytes"
            + (", signed" if result["signed"] else "")
        )
    else:
        print(f"fxcache: not saved: {result['reason']}")
    if job is not None:
        _job_line(job, sys.stderr if as_json else sys.stdout)
    sent = result.get("remote")
    if sent and not as_json:
        if sent.get("published") and "files" in sent:
            print(
                f"fxcache: published to {sent['url']}: {sent['files']} file(s), "
                f"{sent['uploaded_bytes']} bytes uploaded"
            )
        elif sent.get("published"):  # a GitHub cache entry: the whole scope, one archive
            print(f"fxcache: published to {sent['url']}: {sent.get('bytes', 0)} bytes uploaded")
        elif "reason" in sent:
            print(f"fxcache: nothing published to {sent['url']}: {sent['reason']}")
    return 0


def _job_line(job: dict[str, Any], out: Any) -> None:
    """The job's own line; none when its trace held nothing (a job that compiled nothing, or
    the trace off): `fxcache stats` and the JSON still say so."""
    from ci_fxcache import gha
    from ci_fxcache.report import job_line
    from ci_fxcache.report.render import plain

    if job_line.observed(job):
        gha.print_untrusted(f"fxcache: {plain(job_line.headline(job))}\n", file=out)
