"""`fxcache plan` decides on user workloads as `fxcache verify` does (one check, shared: it
imports the workload and calls its factory in the user's interpreter), and `invalidate --root`
refuses a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, TORCH_PYTHON, RunFxcache

pytestmark = pytest.mark.slow

AXES = ("--device", "cpu", "--dtypes", "float32", "--dynamic", "false", "--mechanisms",
        "fxgraph", "--training", "false")  # fmt: skip


@pytest.mark.parametrize(
    "workload",
    [
        "nosuch_package.module:factory",
        "tests.workloads.faulty:wrong_shape",
        "tests.workloads.faulty:no_tensors",
        "tests.workloads.faulty:not_callable",
    ],
)
def test_plan_exits_2_on_a_bad_workload_with_verifys_line(
    run_fxcache: RunFxcache, workload: str
) -> None:
    args = ("--python", TORCH_PYTHON, "--workloads", workload, *AXES)
    plan = run_fxcache("plan", "--runners", "gpu-a100", *args, timeout=600, cwd=ROOT)
    verify = run_fxcache("verify", *args, timeout=600, cwd=ROOT)
    assert (plan.returncode, verify.returncode) == (2, 2), plan.stderr + verify.stderr
    assert plan.stdout == ""
    (line,) = plan.stderr.splitlines()
    assert line.startswith(f"fxcache: error: workload {workload}: "), line
    assert plan.stderr == verify.stderr


def test_plan_accepts_a_good_workload(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache(
        "plan", "--python", TORCH_PYTHON, "--workloads", "tests.workloads.faulty:sin_matmul",
        *AXES, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_plan_without_torch_says_the_workloads_are_left_to_verify(
    run_fxcache: RunFxcache, python_without_torch: str
) -> None:
    """The fleet workflow's plan job runs on a light runner without torch: it must not fail."""
    proc = run_fxcache(
        "plan", "--python", python_without_torch, "--workloads", "nosuch_package.module:f",
        *AXES, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("fxcache: warning: user workloads not checked here: torch is not "), line


def test_invalidate_root_that_is_a_file_is_a_usage_error(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    root = tmp_path / "not-a-store"
    root.write_text("")
    proc = run_fxcache("invalidate", "--root", str(root), "--max-age", "30d")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"fxcache: error: --root: {root} exists and is not a directory"
    ]
    assert proc.stdout == ""
