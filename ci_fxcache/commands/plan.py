"""`fxcache plan`: the runner-pool job matrix for the reusable fleet workflow."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ci_fxcache import gha


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the `plan` subcommand."""
    parser = sub.add_parser(
        "plan",
        parents=[parent],
        help="turn runner pools into the fleet workflow's job matrix",
        description="Print the job matrix (JSON for fromJSON) of workflows/fxcache-verify.yml: "
        "one verify job per runner pool, each with the artifact name its results travel in. "
        "Inside Actions it is also the step output 'matrix'.",
    )
    parser.add_argument(
        "--runners",
        default=os.environ.get("FXCACHE_RUNNERS", ""),
        metavar="SPEC",
        help="runner pools: comma or newline list of labels, '+' joining the labels of one "
        "pool (self-hosted+gpu-a100), or a JSON list of labels / label lists "
        "(env FXCACHE_RUNNERS)",
    )
    parser.add_argument(
        "--report-id", default="fxcache", help="names the artifacts (default: fxcache)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the matrix; set the `matrix` step output inside Actions."""
    from ci_fxcache import plan

    doc = plan.matrix(plan.plan(args.runners, args.report_id))
    text = json.dumps(doc, separators=(",", ":"))
    gha.set_output("matrix", text)
    print(json.dumps(doc, indent=2))
    return 0
