"""Whether a matrix's user workloads (`package.module:factory`) can run: one decision for
`fxcache verify` and `fxcache plan`, so that the two exit alike (2) on a workload that does not
import, whose factory fails or returns the wrong shape of thing, or whose factory hangs."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ci_fxcache import gha
from ci_fxcache.env import interpreter
from ci_fxcache.errors import UsageError
from ci_fxcache.verify.forkserver import ForkServer
from ci_fxcache.verify.matrix import Matrix


def user_workloads(matrix: Matrix) -> list[str]:
    """The matrix's workloads that are user factories (`package.module:factory`)."""
    return [name for name in matrix.workloads if ":" in name]


def check(
    server: ForkServer,
    names: list[str],
    device: str,
    work_dir: Path,
    timeout: float,
    env: dict[str, str],
) -> None:
    """Import each workload in the user's interpreter (the fork server's child) and call its
    factory once on `device`; UsageError (exit 2) on a bad one. The check gets the per-phase
    timeout: a factory slower than that would time out every phase."""
    for name in names:
        outcome = server.run(
            "check",
            {"workload": name, "device": device},
            work_dir / name.replace(":", "_"),
            "check",
            timeout,
            env,
        )
        if outcome.timed_out:
            raise UsageError(
                f"workload {name}: the check timed out after {timeout:g} s (--timeout); "
                "does its factory hang?"
            )
        result = outcome.result or {}
        if result.get("status") != "ok":
            why = result.get("error") or (
                f"the check process ended with {outcome.signal or outcome.returncode}"
                + (f": {outcome.log_tail.splitlines()[-1]}" if outcome.log_tail else "")
            )
            raise UsageError(why)


PLAN_TIMEOUT_S = 600.0  # verify's default --timeout


def check_for_plan(python: str, matrix: Matrix) -> None:
    """`fxcache plan`: the check `verify` makes, in `python`, on the CPU (a plan job has no
    GPU to build a CUDA model on). An interpreter without torch (the fleet workflow's plan job
    runs on a light runner) cannot run a factory: a warning says the check is left to each
    verify job."""
    names = user_workloads(matrix)
    if not names:
        return
    path = interpreter.resolve(python)
    if interpreter.run_snippet(path, "read_versions").get("torch_path") is None:
        gha.warn(
            f"user workloads not checked here: torch is not installed for {python} "
            "(each verify job checks them; pass --python to check them now)"
        )
        return
    work = Path(tempfile.mkdtemp(prefix="fxcache-plan-"))
    try:
        server = ForkServer(path, work)
        try:
            check(server, names, "cpu", work / ".checks", PLAN_TIMEOUT_S, {})
        finally:
            server.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
