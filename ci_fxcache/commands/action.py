"""`fxcache action STEP`: one step of the GitHub Action (hidden from --help; the action's YAML
files call it with their inputs in $FXCACHE_INPUTS)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the hidden `action` subcommand (no help= keeps it out of the command list). The
    step's name is checked by steps.run, not here: parsing imports no step."""
    parser = sub.add_parser(
        "action",
        parents=[parent],
        description="Internal: one step of the fxcache GitHub Action. Reads the action's "
        "inputs as JSON from $FXCACHE_INPUTS and setup's settings from "
        "$FXCACHE_ACTION_SETTINGS; writes step outputs and the job's environment.",
    )
    parser.add_argument("step", help=argparse.SUPPRESS)
    parser.add_argument("what", nargs="?", default=None, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def run(*, step: str, what: str | None) -> int:
    """Run the step. The restore step (steps.STEPS names it too) runs without importing the
    others: it is on every job's critical path (action/restore_step.py)."""
    if step == "restore":
        from ci_fxcache.action import restore_step

        return restore_step.restore()
    from ci_fxcache.action import steps

    return steps.run(step, what)
