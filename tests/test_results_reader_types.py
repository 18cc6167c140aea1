"""Issue 26 §3 and issue 23 §6 item 4: the reader enforces results.schema.json's types.

A document that breaks them is refused with one line (exit 2, no traceback) before anything
renders it; `schema_check` (the reader's interpreter of the schema) is held to the verdicts of
the `jsonschema` package on random mutations of a real document.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci_fxcache.results import schema_check
from tests.conftest import RunFxcache
from tests.fake_github import FakeGitHub

DATA = Path(__file__).parent / "data"
BASE = json.loads((DATA / "results_h200.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(schema_check.schema())

# JSON values within the two rules schema_check adds (finite numbers, 64-bit integers).
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**62), 2**62)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", "safe", "hit", "float32", "ok", "x" * 3, "2026-01-01T00:00:00Z"])
    | st.text(max_size=8)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


PATHS = [p for p in _paths(BASE) if p]


def _mutated(path: tuple[Any, ...], value: Any, delete: bool) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    node: Any = doc
    for part in path[:-1]:
        node = node[part]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(PATHS),
    value=_VALUES,
    delete=st.booleans(),
)
def test_schema_check_agrees_with_jsonschema(
    path: tuple[Any, ...], value: Any, delete: bool
) -> None:
    doc = _mutated(path, value, delete)
    ours = schema_check.problem(doc)
    theirs = next(iter(VALIDATOR.iter_errors(doc)), None)
    assert (ours is None) == (theirs is None), (path, value, delete, ours, theirs)


def test_the_shipped_documents_pass() -> None:
    for name in ("results_h200.json", "results_cpu.json", "verify_real_cpu.json", "shard_t4.json"):
        assert schema_check.problem(json.loads((DATA / name).read_text())) is None, name


@pytest.mark.parametrize(
    "value, words",
    [(float("inf"), "not a finite number"), (2**63, "too large"), (-(2**70), "too large")],
)
def test_numbers_beyond_the_schema_are_refused(value: float, words: str) -> None:
    doc = copy.deepcopy(BASE)
    doc["combos"][0]["hits"] = value
    assert words in str(schema_check.problem(doc))


HOSTILE = {
    "hits": "<img src=x> @acme/security-team [Approve](https://evil.example) |",
    "misses": "</details><h1>APPROVED BY MAINTAINERS</h1>",
}


def _write(tmp_path: Path, doc: dict[str, Any], name: str = "results.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _one_line_usage_error(proc: Any) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    return str(proc.stderr)


def test_a_string_where_a_count_belongs_is_refused(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    doc = copy.deepcopy(BASE)
    doc["combos"][0].update(HOSTILE)
    err = _one_line_usage_error(run_fxcache("report", str(_write(tmp_path, doc)), "--format", "md"))
    assert "combos[0].hits is a string; expected integer" in err
    assert "<img" not in err and "@acme" not in err  # the hostile text is never repeated


def test_a_5000_digit_integer_is_one_line(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    """Issue 23 §6 item 4: Python refuses to convert it (4,300 digits at most) with a
    traceback; the reader refuses it first."""
    text = json.dumps(BASE).replace('"hits": 1,', '"hits": ' + "7" * 5000 + ",", 1)
    assert "7" * 5000 in text
    path = tmp_path / "big.json"
    path.write_text(text)
    for fmt in ("md", "text"):
        err = _one_line_usage_error(run_fxcache("report", str(path), "--format", fmt))
        assert "integer of 5000 digits" in err


def test_the_fork_comment_path_refuses_it_before_posting(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    """The reproduction of issue 26 §3: a fork's artifact, posted with the base token."""
    fake_github.add_pull(7)
    doc = copy.deepcopy(BASE)
    doc["report_id"] = "fork"
    doc["combos"][0].update(HOSTILE)
    folder = tmp_path / "fxcache-report-fork"
    folder.mkdir()
    proc = run_fxcache(
        "comment", str(_write(folder, doc)), "--pr", "7", "--from-artifact", folder.name,
        env=fake_github.env(),
    )  # fmt: skip
    _one_line_usage_error(proc)
    assert fake_github.calls("POST", r".*/comments") == [] and fake_github.comments[7] == []
