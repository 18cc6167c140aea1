"""`fxcache plan`: the fleet's job matrix (runner pools), and the verification matrix checked
the way `fxcache verify` will read it, so a typo fails in a cheap step before any GPU runner or
any store is touched."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ci_fxcache import gha
from ci_fxcache.commands import options, verify


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the `plan` subcommand."""
    parser = sub.add_parser(
        "plan",
        parents=[parent],
        help="check the matrix and turn runner pools into the fleet workflow's job matrix",
        description="Check the verification matrix (the same flags as 'fxcache verify') and, "
        "with --runners, print the job matrix of workflows/fxcache-verify.yml: one verify job "
        "per runner pool, each with the artifact name its results travel in. Inside Actions "
        "the step outputs are 'matrix' (for fromJSON) and 'combos' (JSON list of ids).",
    )
    parser.add_argument(
        "--runners",
        default=os.environ.get("FXCACHE_RUNNERS"),
        metavar="SPEC",
        help="runner pools: comma or newline list of labels, '+' joining the labels of one "
        "pool (self-hosted+gpu-a100), or a JSON list of labels / label lists "
        "(env FXCACHE_RUNNERS; default: none: only the verification matrix is checked)",
    )
    options.report_id_option(
        parser,
        default="fxcache",
        help="names the artifacts (default: fxcache)",
    )
    verify.add_matrix_options(parser, "verification matrix (as for 'fxcache verify')")
    options.python_option(parser)  # user workloads are checked there, as verify checks them
    parser.set_defaults(func=run)


def run(
    *,
    runners: str | None,
    report_id: str,
    devices: str | None,
    dtypes: str | None,
    dynamic: str | None,
    mechanisms: str | None,
    training: str | None,
    workloads: str | None,
    modes: str | None,
    matrix_file: str | None,
    python: str,
    ranks: str | None,
) -> int:
    """Print {"matrix": job matrix or null, "combos": [...]}; set step outputs in Actions."""
    from ci_fxcache.fleet import plan
    from ci_fxcache.verify import matrix, workload_check

    flags = verify.matrix_flags(
        devices, dtypes, dynamic, mechanisms, training, workloads, modes, ranks
    )
    combos = plan.combos(flags, matrix_file)
    workload_check.check_for_plan(python, matrix.build(flags, matrix_file))
    job_matrix = None
    if runners is not None:
        job_matrix = plan.matrix(plan.plan(runners, report_id))
        gha.set_output("matrix", json.dumps(job_matrix, separators=(",", ":")))
    gha.set_output("combos", json.dumps(combos, separators=(",", ":")))
    print(json.dumps({"matrix": job_matrix, "combos": combos}, indent=2))
    return 0
