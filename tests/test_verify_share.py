"""One cold phase shared by fxgraph and mega, and kernel builds shared by a run's phases: the
same verdicts as separate cold phases that build everything themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.verify import matrix, runner
from tests.conftest import RunFxcache
from tests.test_verify import load, verify


def test_default_matrix_shares_fxgraph_and_mega_cold_phases_only() -> None:
    combos = matrix.build(dict.fromkeys(matrix.FLAGS), None)
    combos.devices = ["cpu"]
    groups = runner.cold_groups(combos.combos(), share=True)
    shared = [[c.mechanism for c in g] for g in groups if len(g) > 1]
    assert shared == [["fxgraph", "mega"]] * 4
    alone = [g[0].mechanism for g in groups if len(g) == 1]
    assert alone == ["precompile", "aot", "precompile-api"] * 4  # each its own cold phase
    for group in groups:  # one workload / dtype / dynamic / training per group
        assert len({(c.dtype, c.dynamic, c.workload, c.training) for c in group}) == 1
    assert all(len(g) == 1 for g in runner.cold_groups(combos.combos(), share=False))
    # the shared cold phases start first: precompile's cold phase then finds their kernels
    ordered = runner.shared_first(groups)
    assert [len(g) for g in ordered] == [2] * 4 + [1] * 12
    assert [g[0].id for g in ordered[:4]] == [g[0].id for g in groups if len(g) > 1]


def test_the_fxgraph_combination_runs_the_shared_cold_phase_whatever_the_order() -> None:
    plan = matrix.build({**dict.fromkeys(matrix.FLAGS), "mechanisms": "mega,fxgraph"}, None)
    plan.devices = ["cpu"]
    groups = runner.cold_groups(plan.combos(), share=True)
    assert [[c.mechanism for c in g] for g in groups] == [["fxgraph", "mega"]] * 4
    # a group of one (no fxgraph to share with) keeps its own cold phase
    plan.mechanisms = ["mega", "precompile"]
    assert all(len(g) == 1 for g in runner.cold_groups(plan.combos(), share=True))


def test_auto_decides_hot_only_per_combination(tmp_path: Path) -> None:
    plan = matrix.build({**dict.fromkeys(matrix.FLAGS), "mechanisms": "fxgraph,mega"}, None)
    plan.devices = ["cpu"]
    combos = plan.combos()
    with_reference = combos[0]
    (tmp_path / with_reference.id).mkdir()
    for name in ("reference.json", "reference.pt"):
        (tmp_path / with_reference.id / name).write_text("{}")
    auto = runner.hot_only_ids("auto", tmp_path, combos)
    assert auto == {with_reference.id}  # the others compile cold; this one is not rebuilt
    assert runner.hot_only_ids("hot", tmp_path, combos) == {c.id for c in combos}
    assert runner.hot_only_ids("both", tmp_path, combos) == set()
    assert runner.hot_only_ids("cold", tmp_path, combos) == set()


def _pids(doc: dict[str, Any], cid: str) -> dict[str, int]:
    """The processes the combination's phases ran in, from the results document."""
    combo = next(c for c in doc["combos"] if c["id"] == cid)
    return {phase: combo[phase]["pid"] for phase in ("cold", "hot") if "pid" in combo[phase]}


@pytest.mark.slow
def test_shared_cold_phases_give_the_same_verdicts_as_separate_ones(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    """bfloat16 static and dynamic (the weak spot upstream), fxgraph and mega, trained: once
    with one cold phase per group, once with one per combination (FXCACHE_SEPARATE_COLD=1)."""
    docs = {}
    for mode, env in (("shared", {}), ("separate", {"FXCACHE_SEPARATE_COLD": "1"})):
        args = ("--dtypes", "bfloat16", "--dynamic", "false,true", "--mechanisms", "fxgraph,mega")
        out = tmp_path / f"{mode}.json"
        proc = verify(
            run_fxcache,
            *args,
            *("--training", "true", "--cache-dir", str(tmp_path / mode), "--json", str(out)),
            env=env,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        docs[mode] = load(out)
    shared, separate = ({c["id"]: c for c in docs[m]["combos"]} for m in ("shared", "separate"))
    assert len(shared) == 4
    assert {i: (c["verdict"], c["cause"]) for i, c in shared.items()} == {
        i: (c["verdict"], c["cause"]) for i, c in separate.items()
    }
    for cid, combo in shared.items():
        assert combo["cold"]["status"] == "ok", combo["reason"]
        fx = cid.replace("-mega-", "-fxgraph-")
        assert combo["cold"]["serves"] == [fx, fx.replace("-fxgraph-", "-mega-")]
        assert "serves" not in separate[cid]["cold"]
        # both combinations are judged on the evidence of one cold process
        assert combo["cold"] == shared[fx]["cold"]
        assert (tmp_path / "shared" / cid / "reference.json").is_file()
    for cid in shared:
        if "-mega-" not in cid:
            continue
        fx = cid.replace("-mega-", "-fxgraph-")
        fx_pids, mega_pids = _pids(docs["shared"], fx), _pids(docs["shared"], cid)
        # one cold process serves both; two hot phases, each in a process of its own
        assert fx_pids["cold"] == mega_pids["cold"], (fx_pids, mega_pids)
        assert len({fx_pids["cold"], fx_pids["hot"], mega_pids["hot"]}) == 3, (fx_pids, mega_pids)
        assert len(set(_pids(docs["separate"], cid).values())) == 2
        # the mega hot load rebuilt the kernels its cold phase built: copied from the run's
        # build memo, counted all the same (the verdict stands), its time not its own
        hot = shared[cid]["hot"]
        assert hot["kernels_from_memo"] == hot["kernels_built"] >= 1, hot
        assert shared[cid]["speedup"] is None and "not measured" in shared[cid]["reason"]
        alone = separate[cid]["hot"]
        assert "kernels_from_memo" not in alone and alone["kernels_built"] == hot["kernels_built"]
        assert separate[cid]["speedup"] is not None
        # fxgraph's phases build for themselves: the speedup of the real gain stays measured
        assert "kernels_from_memo" not in shared[fx]["cold"] and shared[fx]["speedup"] is not None
