"""`fxcache merge`: several runners' results (the fleet fan-out) -> one fxcache-merged/2 doc."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ci_fxcache import gha, userfiles
from ci_fxcache.commands import options


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the `merge` subcommand."""
    parser = sub.add_parser(
        "merge",
        parents=[parent],
        help="merge results shards from several runners into one fleet document",
        description="Group shards by environment (fingerprint): different environments are "
        "kept apart, never averaged. Accepts fxcache-results/2 and fxcache-merged/2 inputs "
        "(and version 1 of both).",
    )
    parser.add_argument("shards", nargs="+", metavar="SHARD", help="results JSON files")
    parser.add_argument(
        "-o", "--output", required=True, metavar="OUT", help="merged JSON file (required)"
    )
    parser.add_argument(
        "--job-stats",
        action="append",
        default=[],
        metavar="FIGURES",
        help="a runner's own job figures (fxcache stats --json after its save); repeat for "
        "each runner: the fleet report shows one job line per architecture (default: none)",
    )
    options.report_id_option(
        parser,
        default=None,
        help="report id of the merged document (default: the shards' own; the first "
        "shard's where they differ)",
    )
    parser.set_defaults(func=run)


def run(*, shards: list[str], output: str, report_id: str | None, job_stats: list[str]) -> int:
    """Write the merged document."""
    from ci_fxcache.fleet import merge

    userfiles.output_file(output, "-o")
    doc = merge.merge(list(shards), report_id, list(job_stats))
    userfiles.write_output(output, json.dumps(doc, indent=2) + "\n", "-o")
    groups = doc["groups"]
    gha.print_untrusted(
        f"merged {sum(len(g['shards']) for g in groups)} shard(s) into {len(groups)} "
        f"environment(s): {', '.join(g['title'] for g in groups)} -> {output}\n"
    )
    return 0
