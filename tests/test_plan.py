"""`fxcache plan`: runner pools -> the fleet workflow's job matrix (the real CLI, subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import RunFxcache


def _include(proc: object) -> list[dict[str, object]]:
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    return json.loads(proc.stdout)["include"]  # type: ignore[attr-defined, no-any-return]


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


def test_step_output_is_compact_matrix(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.touch()
    proc = run_fxcache(
        "plan", "--runners", "a,b", env={"GITHUB_ACTIONS": "true", "GITHUB_OUTPUT": str(out)}
    )
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    assert lines[0].startswith("matrix<<") and lines[2] == lines[0].split("<<")[1]
    assert json.loads(lines[1]) == json.loads(proc.stdout)
    assert "\n" not in lines[1] and " " not in lines[1]


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
    assert proc.stderr.startswith("::error::fxcache: report id 'x/y'")
    assert len(proc.stderr.splitlines()) == 1
