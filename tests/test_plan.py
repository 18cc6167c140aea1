"""`fxcache plan`: runner pools -> the fleet workflow's job matrix (the real CLI, subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import RunFxcache


def _include(proc: object) -> list[dict[str, object]]:
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    return json.loads(proc.stdout)["matrix"]["include"]  # type: ignore[attr-defined, no-any-return]


def test_text_spec_pools_and_artifacts(run_fxcache: RunFxcache) -> None:
    include = _include(
        run_fxcache(
            "plan", "--runners", "gpu-a100, self-hosted+gpu-h100\ngpu-l4,", "--report-id", "nightly"
        )
    )
    assert include == [
        {"pool": "gpu-a100", "runs-on": ["gpu-a100"], "artifact": "fxcache-nightly-pool-gpu-a100"},
        {
            "pool": "self-hosted+gpu-h100",
            "runs-on": ["self-hosted", "gpu-h100"],
            "artifact": "fxcache-nightly-pool-self-hosted+gpu-h100",
        },
        {"pool": "gpu-l4", "runs-on": ["gpu-l4"], "artifact": "fxcache-nightly-pool-gpu-l4"},
    ]


def test_json_spec_equals_text_spec(run_fxcache: RunFxcache) -> None:
    text = _include(run_fxcache("plan", "--runners", "a100,self-hosted+h100"))
    as_json = _include(run_fxcache("plan", "--runners", '["a100", ["self-hosted", "h100"]]'))
    assert text == as_json


def test_step_outputs_are_compact_json(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.touch()
    proc = run_fxcache(
        "plan", "--runners", "a,b", "--dtypes", "float32", "--dynamic", "false",
        "--mechanisms", "fxgraph", "--device", "cpu",
        env={"GITHUB_ACTIONS": "true", "GITHUB_OUTPUT": str(out)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    lines = out.read_text().splitlines()
    outputs = {lines[i].split("<<")[0]: lines[i + 1] for i in range(0, len(lines), 3)}
    assert set(outputs) == {"matrix", "combos"}
    assert json.loads(outputs["matrix"]) == doc["matrix"]
    assert (
        json.loads(outputs["combos"])
        == doc["combos"]
        == ["sin_matmul-cpu-float32-static-fxgraph-train"]
    )
    assert " " not in outputs["matrix"] + outputs["combos"]


def test_without_runners_only_the_matrix_is_checked(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache("plan", "--device", "cpu", "--dtypes", "float32,bfloat16", "--dynamic",
                       "false", "--mechanisms", "fxgraph", "--training", "false,true")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["matrix"] is None
    assert len(doc["combos"]) == 4
    assert "sin_matmul-cpu-bfloat16-static-fxgraph-infer" in doc["combos"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dtypes", "bf17"], "--dtypes bf17: unknown dtype value 'bf17'"),
        (["--dynamic", "maybe"], "unknown dynamic value 'maybe'"),
        (["--workloads", "no such"], "unknown workload 'no such'"),
        (["--matrix-file", "/nonexistent.yml"], "--matrix-file /nonexistent.yml: no such file"),
    ],
)
def test_bad_matrix_fails_like_verify(
    run_fxcache: RunFxcache, args: list[str], message: str
) -> None:
    """The plan job (and the action's settings step) reject what verify would, before any
    GPU runner or store is touched."""
    plan = run_fxcache("plan", "--runners", "gpu-a100", *args)
    assert plan.returncode == 2 and plan.stdout == ""
    assert len(plan.stderr.splitlines()) == 1 and message in plan.stderr, plan.stderr
    verify = run_fxcache("verify", *args, "--json", "-")
    assert verify.returncode == 2
    assert plan.stderr == verify.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "no runner pool given"),
        (" , \n", "no runner pool given"),
        ("a100,a100", "pool 'a100' is listed twice"),
        ("self-hosted+h100,h100+self-hosted", "listed twice"),
        ("gpu a100", "'gpu a100' is not a runner label"),
        ("a100,+h100", "'' is not a runner label"),
        ('["a100", 3]', "3 is neither a label nor a label list"),
        ('{"a": 1}', "must be a list"),
        ('["a100"', "not valid JSON"),
        (",".join(f"p{i}" for i in range(257)), "at most 256"),
    ],
)
def test_bad_specs_are_one_line_usage_errors(
    run_fxcache: RunFxcache, spec: str, message: str
) -> None:
    proc = run_fxcache("plan", "--runners", spec)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_bad_report_id_inside_actions_is_one_annotation(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache(
        "plan", "--runners", "a100", "--report-id", "x/y", env={"GITHUB_ACTIONS": "true"}
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("::error::fxcache: argument --report-id: invalid report id 'x/y'")
    assert len(proc.stderr.splitlines()) == 1
