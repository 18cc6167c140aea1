"""The mechanism registry (ci_fxcache/mechanisms.py): one record per verification mechanism,
read by the matrix, the torch gate, the runner, the verdicts and the re-check; the worker's
torch calls keyed by the same names. Fast, no compile."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ci_fxcache import mechanisms
from ci_fxcache.env import torch_support
from ci_fxcache.fleet import plan
from ci_fxcache.verify import artifact_evidence, matrix, runner, verdicts
from ci_fxcache.worker import artifacts, phase
from tests.conftest import ROOT, RunFxcache

NEW = mechanisms.Mechanism(
    name="new-mech",
    needs=("fx_graph_cache", "aot_compile"),
    files=("new.bin",),
    hits="artifact",
    shares_cold=True,
    carried=True,
    default=False,
)


@pytest.fixture
def with_new(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mechanisms, "ALL", (*mechanisms.ALL, NEW))


def test_a_new_record_is_all_the_planner_needs(with_new: None) -> None:
    """Nothing else names the mechanisms: one record makes the matrix accept it, the plan list
    it, the gate, the shared cold phase, the verdicts and the re-check read it."""
    flags: dict[str, str | None] = {
        "mechanisms": "fxgraph,new-mech",
        "dtypes": "float32",
        "dynamic": "false",
    }
    ids = plan.combos(flags, None)
    assert ids == [
        "sin_matmul-auto-float32-static-fxgraph-train",
        "sin_matmul-auto-float32-static-new-mech-train",
    ]
    assert "new-mech" not in matrix.Matrix().mechanisms  # default=False
    assert torch_support.too_old("2.8.0", "new-mech") is not None  # its gate: aot_compile, 2.9
    assert torch_support.too_old("2.9.0", "new-mech") is None
    combos = matrix.build(flags, None).combos()
    assert [len(g) for g in runner.cold_groups(combos, share=True)] == [2]  # one cold phase
    assert artifact_evidence.judges("new-mech") and not artifact_evidence.judges("fxgraph")


def test_a_new_record_without_its_flags_changes_nothing_it_does_not_name(
    with_new: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = replace(NEW, shares_cold=False, carried=False, hits="caches")
    monkeypatch.setattr(mechanisms, "ALL", (*mechanisms.ALL[:-1], plain))
    flags: dict[str, str | None] = {"mechanisms": "fxgraph,new-mech", "dtypes": "float32"}
    combos = matrix.build({**flags, "dynamic": "false"}, None).combos()
    assert [len(g) for g in runner.cold_groups(combos, share=True)] == [1, 1]
    assert not artifact_evidence.judges("new-mech")
    assert verdicts.hits_and_misses("new-mech", {"fxgraph_cache_hit": 2})[0] == 2


def test_an_unknown_name_is_refused_naming_every_record(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache("plan", "--mechanisms", "magic")
    assert proc.returncode == 2
    assert f"choose from {', '.join(mechanisms.names())}" in proc.stderr
    help_text = run_fxcache("verify", "--help").stdout
    assert ", ".join(mechanisms.names()) in " ".join(help_text.split())


def test_the_registry_today() -> None:
    """The records as the code before the registry had them in five tuples."""
    by = {m.name: m for m in mechanisms.ALL}
    assert mechanisms.names() == ("fxgraph", "mega", "precompile", "remote", "aot",
                                  "precompile-api")  # fmt: skip
    assert mechanisms.defaults() == ["fxgraph", "mega", "precompile", "aot", "precompile-api"]
    assert runner.shared_cold() == ("fxgraph", "mega")
    assert [n for n, m in by.items() if m.carried] == ["mega", "precompile", "aot",
                                                       "precompile-api"]  # fmt: skip
    assert [n for n, m in by.items() if m.hits == "artifact"] == ["aot", "precompile-api"]
    assert [n for n, m in by.items() if m.redis] == ["remote"]
    assert [n for n, m in by.items() if m.hot_in_place] == ["fxgraph"]
    # carried only where the hot phase reads the same bytes every run
    assert all(not (m.carried and (m.hot_in_place or m.redis)) for m in mechanisms.ALL)
    assert len(set(mechanisms.names())) == len(mechanisms.ALL)
    with pytest.raises(KeyError, match="unknown mechanism 'magic'"):
        mechanisms.get("magic")


def test_every_gate_names_known_options() -> None:
    for m in mechanisms.ALL:
        assert m.needs and set(m.needs) <= set(torch_support.OPTIONS), m.name


def test_the_worker_turns_on_what_each_record_says() -> None:
    """The worker's dispatch (worker/phase.py TORCH) holds exactly the registry's names, and
    the files each record names are the ones the worker writes and reads."""
    assert set(phase.TORCH) == set(mechanisms.names())
    assert phase.CACHE_ARTIFACTS == mechanisms.CACHE_ARTIFACTS
    for m in mechanisms.ALL:
        turns = phase.TORCH[m.name]
        assert turns.remote == m.redis, m.name
        assert turns.cache_artifacts == (mechanisms.CACHE_ARTIFACTS in m.files), m.name
        assert turns.artifact == (m.hits == "artifact"), m.name
        assert turns.caching_precompile == (m.hits == "dynamo"), m.name
    assert mechanisms.get("aot").files == (artifacts.AOT_FILE,)
    assert mechanisms.get("precompile-api").files == artifacts.PRECOMPILE_FILES


def test_the_results_schema_names_the_registry() -> None:
    schema = json.loads((ROOT / "ci_fxcache" / "results" / "results.schema.json").read_text())
    text = json.dumps(schema)
    assert json.dumps({"enum": list(mechanisms.names())}) in text
    artifact = [m.name for m in mechanisms.ALL if m.hits == "artifact"]
    assert json.dumps({"enum": artifact}) in text
