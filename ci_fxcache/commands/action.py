"""`fxcache action STEP`: one step of the GitHub Action (hidden from --help; the action's YAML
files call it with their inputs in $FXCACHE_INPUTS)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the hidden `action` subcommand (no help= keeps it out of the command list)."""
    from ci_fxcache.action import steps

    parser = sub.add_parser(
        "action",
        parents=[parent],
        description="Internal: one step of the fxcache GitHub Action. Reads the action's "
        "inputs as JSON from $FXCACHE_INPUTS and setup's settings from "
        "$FXCACHE_ACTION_SETTINGS; writes step outputs and the job's environment.",
    )
    parser.add_argument("step", choices=sorted([*steps.STEPS, "describe"]))
    parser.add_argument("what", nargs="?", default=None, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def run(*, step: str, what: str | None) -> int:
    """Run the step."""
    from ci_fxcache.action import steps

    return steps.run(step, what)
