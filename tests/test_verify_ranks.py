"""`fxcache verify --ranks 2`: real torch.distributed phases (gloo on the CPU), two fresh
processes per phase, faults injected on one rank."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunFxcache
from tests.test_verify import _run_once, _shared, load, verify_one

MLP = "tests.workloads.ranked:mlp"
DDP_MLP = "tests.workloads.ranked:ddp_mlp"

RanksRun = tuple[Any, dict[str, Any], Path]


@pytest.fixture(scope="module")
def ranks_run(tmp_path_factory: pytest.TempPathFactory) -> RanksRun:
    """One cold+hot run of 2 ranks for both factories (shared by every test here)."""
    root = _shared(tmp_path_factory, "verify-ranks")
    out = root / "results.json"
    proc = _run_once(
        root,
        *("--workloads", f"{MLP},{DDP_MLP}", "--ranks", "2", "--device", "cpu"),
        *("--dtypes", "float32", "--dynamic", "false", "--mechanisms", "fxgraph"),
        *("--training", "true", "--cache-dir", str(root / "cache"), "--json", str(out)),
    )
    return proc, load(out) if out.exists() else {}, root / "cache"


def _combo(doc: dict[str, Any], workload: str) -> dict[str, Any]:
    (combo,) = [c for c in doc["combos"] if c["workload"] == workload]
    return combo


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "wrapper"),
    [(MLP, "DistributedDataParallel"), (DDP_MLP, "the factory's DistributedDataParallel")],
)
def test_two_ranks_with_gloo_and_ddp_are_safe(
    ranks_run: RanksRun, workload: str, wrapper: str
) -> None:
    proc, doc, _ = ranks_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["matrix"]["ranks"] == ["2"]
    combo = _combo(doc, workload)
    assert combo["ranks"] == 2 and combo["id"].endswith("-r2"), combo["id"]
    assert (combo["verdict"], combo["cause"]) == ("safe", "hit"), combo["reason"]
    assert combo["reason"].startswith("all 2 ranks: hot load hit")
    assert [r["rank"] for r in combo["rank_verdicts"]] == [0, 1]
    assert all(r["verdict"] == "safe" and r["hits"] for r in combo["rank_verdicts"])
    for phase in ("cold", "hot"):
        ranks = combo[phase]["ranks"]
        assert [p["rank"] for p in ranks] == [0, 1]
        assert len({p["pid"] for p in ranks}) == 2  # two processes, fresh in each phase
        assert all(p["rank_wrapper"] == wrapper for p in ranks)
    assert not {p["pid"] for p in combo["cold"]["ranks"]} & {
        p["pid"] for p in combo["hot"]["ranks"]
    }
    assert "2 ranks" in proc.stdout
    from ci_fxcache.verify import versions

    assert versions.recorded(ranks_run[2] / combo["id"])  # the next job runs it hot only


def _hot_fault(run_fxcache: RunFxcache, ranks_run: RanksRun, fault: str, *extra: str) -> Any:
    """A hot-only run of the MLP's 2 ranks on a copy of the fixture's cache, `fault` on rank 1."""
    proc0, _, shared = ranks_run
    assert proc0.returncode == 0, proc0.stdout + proc0.stderr
    cache = shared.with_name(f"{shared.name}-{fault}")
    shutil.rmtree(cache, ignore_errors=True)
    shutil.copytree(shared, cache)
    proc, combo = verify_one(
        run_fxcache,
        cache,
        *("--ranks", "2", "--device", "cpu", "--recheck-all", *extra),
        workload=MLP,
        env={"FXCACHE_TEST_RANK_FAULT": f"{fault}:1"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return combo


@pytest.mark.slow
def test_code_tampered_for_one_rank_is_unsafe_naming_the_rank(
    ranks_run: RanksRun, run_fxcache: RunFxcache
) -> None:
    combo = _hot_fault(run_fxcache, ranks_run, "tamper")
    assert (combo["verdict"], combo["cause"]) == ("unsafe", "hot-mismatch"), combo["reason"]
    assert combo["reason"].startswith("on rank 1: "), combo["reason"]
    verdicts = {r["rank"]: (r["verdict"], r["cause"]) for r in combo["rank_verdicts"]}
    assert verdicts == {0: ("safe", "hit"), 1: ("unsafe", "hot-mismatch")}


@pytest.mark.slow
def test_a_rank_that_hangs_is_unsafe_within_the_timeout_naming_the_rank(
    ranks_run: RanksRun, run_fxcache: RunFxcache
) -> None:
    combo = _hot_fault(run_fxcache, ranks_run, "hang", "--timeout", "45")
    assert (combo["verdict"], combo["cause"]) == ("unsafe", "timeout"), combo["reason"]
    assert combo["reason"].startswith("on rank 1: hot phase timed out after 45 s")
    ranks = combo["hot"]["ranks"]
    assert ranks[1]["status"] == "timeout"
    # rank 0 waited for it in a collective and ended on the process group's own timeout
    assert ranks[0]["status"] == "error", ranks[0]


LEAVE_ROUNDS = """
import gc, sys, torch
from torch.nn.parallel import DistributedDataParallel
from ci_fxcache.worker import ranks
rank, where = int(sys.argv[1]), sys.argv[2]
for round in range(8):
    init = f"file://{where}/rendezvous{round}"
    ranks.setup({"dist": {"rank": rank, "world_size": 2, "backend": "gloo",
                          "init_method": init, "timeout_s": 60}}, {})
    net = DistributedDataParallel(torch.nn.Linear(16, 4))
    net(torch.randn(8, 16)).sum().backward()
    ranks.teardown()
    del net  # the model and its reducer go at once, as when a phase's last reference drops
    gc.collect()
print("left", rank)
"""


def test_a_rank_leaves_its_process_group_without_hanging(tmp_path: Path) -> None:
    """Eight rounds of DDP backward, the worker's teardown and the model freed at once: with
    torch 2.13 the gloo group's destructor hung most rounds (its threads waited for the GIL),
    which a verify would have reported as an unsafe timeout."""
    import subprocess
    import sys

    script = tmp_path / "leave.py"
    script.write_text(LEAVE_ROUNDS, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, str(script)]
    procs = [
        subprocess.Popen(
            [*command, str(rank), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("a rank hung leaving its process group")
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.splitlines()[-1] for o in outs] == ["left 0", "left 1"], outs


# --- the axis, the skips and the verdict of several ranks, without compiling -----------------


def test_ranks_values_ids_and_results_only_where_not_one() -> None:
    from ci_fxcache.verify import matrix

    plan = matrix.build({"ranks": "1, 2, 2:shared, 2:one-rank", "workloads": "mlp"}, None)
    assert plan.ranks == ["1", "2", "2:one-rank"]
    ids = [c.id for c in plan.combos() if c.mechanism == "fxgraph" and c.dtype == "float32"]
    assert [i.split("-train")[-1] for i in ids if "static" in i] == ["", "-r2", "-r2-one-rank"]
    one, two, layout = (c for c in plan.combos()[:3])
    assert "ranks" not in one.to_dict() and "ranks" not in matrix.build({}, None).to_dict()
    assert two.to_dict()["ranks"] == 2 and "rank_layout" not in two.to_dict()
    assert layout.to_dict()["rank_layout"] == "one-rank"
    assert two.label.endswith("train 2 ranks") and one.label.endswith("train")


@pytest.mark.parametrize("bad", ["0", "x", "2:other", "100", "-1"])
def test_bad_ranks_values_are_usage_errors(bad: str) -> None:
    from ci_fxcache.errors import UsageError
    from ci_fxcache.verify import matrix

    with pytest.raises(UsageError, match=r"--ranks .*process count"):
        matrix.build({"ranks": bad}, None)


def test_a_matrix_file_takes_ranks_as_numbers(tmp_path: Path) -> None:
    from ci_fxcache.verify import matrix

    path = tmp_path / "m.yaml"
    path.write_text("ranks: [1, 2]\n")
    assert matrix.build({}, str(path)).ranks == ["1", "2"]
    path.write_text("ranks: 2\n")
    assert matrix.build({}, str(path)).ranks == ["2"]


CPU_INFO: dict[str, Any] = {"cuda_capabilities": [], "gloo": True, "nccl": False}


@pytest.mark.parametrize(
    ("axes", "info", "want"),
    [
        ({"ranks": 1, "device": "cuda"}, CPU_INFO, None),
        ({}, CPU_INFO, None),
        ({"device": "cuda"}, {"cuda_capabilities": [[9, 0]], "nccl": True},
         ("no-device", "2 ranks need 2 CUDA devices; this runner has 1")),
        ({"device": "cuda"}, {"cuda_capabilities": [[9, 0]] * 2, "nccl": False},
         ("unsupported", "this torch has no NCCL backend for ranks on CUDA")),
        ({"device": "cuda"}, {"cuda_capabilities": [[9, 0]] * 2, "nccl": True}, None),
        ({}, {**CPU_INFO, "gloo": False},
         ("unsupported", "this torch has no gloo backend for ranks on the CPU")),
        ({}, {**CPU_INFO, "distributed": False},
         ("unsupported", "this torch has no torch.distributed")),
        ({"layout": "one-rank"}, CPU_INFO,
         ("torch-too-old", "compile on one rank needs torch 2.15 (compile_on_one_rank)")),
        ({"layout": "one-rank"}, {**CPU_INFO, "compile_on_one_rank": True}, None),
    ],
)  # fmt: skip
def test_ranks_that_cannot_run_here_are_skipped_naming_what_is_missing(
    axes: dict[str, Any], info: dict[str, Any], want: tuple[str, str] | None
) -> None:
    from ci_fxcache.verify import matrix, ranks, runner

    fields = {"device": "cpu", "ranks": 2, **axes}
    combo = matrix.Combo("mlp", fields.pop("device"), "float32", "false", "fxgraph", True, **fields)
    assert ranks.skip(combo, info) == want
    skip = runner.skip_reason(combo, info, None)
    if combo.device == "cpu" or info["cuda_capabilities"]:
        assert (tuple(skip) if skip else None) == want


def test_artifact_mechanisms_are_skipped_for_several_ranks() -> None:
    from ci_fxcache.verify import matrix, ranks

    combo = matrix.Combo("mlp", "cpu", "float32", "false", "aot", True, ranks=2)
    cause, reason = ranks.skip(combo, CPU_INFO) or ("", "")
    assert cause == "unsupported" and "aot saves one process's compiled function" in reason


def _judged(verdict: str, cause: str, hits: int, misses: int, speedup: float | None) -> Any:
    return {
        "verdict": verdict, "cause": cause, "reason": f"{cause} here", "notes": [],
        "speedup": speedup, "hits": hits, "misses": misses, "cold": {}, "hot": {},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("per_rank", "reason", "verdict", "speedup"),
    [
        ([("safe", "hit", 3, 0, 4.0), ("safe", "hit", 3, 0, 3.0)],
         "all 2 ranks: hit here", "safe", 3.0),
        ([("safe", "hit", 3, 0, 4.0), ("no-gain", "miss", 1, 2, 1.1)],
         "on rank 1: miss here (ranks disagree: rank 0 hit, rank 1 missed)", "no-gain", 1.1),
        ([("unsafe", "hot-error", 0, 0, None), ("unsafe", "crash", 0, 0, None)],
         "on rank 1: crash here", "unsafe", None),
        ([("unsafe", "hot-error", 0, 0, None), ("unsafe", "timeout", 0, 0, None),
          ("safe", "hit", 3, 0, 2.0)], "on rank 1: timeout here", "unsafe", None),
    ],
)  # fmt: skip
def test_the_verdict_of_several_ranks_is_the_worst_ranks_and_names_it(
    monkeypatch: pytest.MonkeyPatch,
    per_rank: list[tuple[str, str, int, int, float | None]],
    reason: str,
    verdict: str,
    speedup: float | None,
) -> None:
    from ci_fxcache.verify import ranks

    def judge(combo: Any, cold: Any, *_: Any) -> Any:
        return _judged(*per_rank[cold["rank"]])

    monkeypatch.setattr(ranks.verdicts, "judge", judge)
    phases = [{"status": "ok", "rank": r} for r in range(len(per_rank))]
    cold = {"status": "ok", "ranks": phases}
    judged = ranks.judge({"ranks": len(per_rank)}, cold, cold, {}, {}, {})
    assert (judged["verdict"], judged["reason"], judged["speedup"]) == (verdict, reason, speedup)
    assert [r["verdict"] for r in judged["rank_verdicts"]] == [p[0] for p in per_rank]
    assert judged["cold"] is cold


def test_merged_phase_is_the_worst_ranks_with_the_slowest_compile() -> None:
    from ci_fxcache.verify import ranks

    ok = [{"status": "ok", "compile_s": 2.0}, {"status": "ok", "compile_s": 3.5}]
    phase, result = ranks.merge(ok, [{"identity": {"a": "1"}}, {}])
    assert (phase["status"], phase["compile_s"], phase["ranks"]) == ("ok", 3.5, ok)
    assert result["identity"] == {"a": "1"} and len(result["ranks"]) == 2
    bad = [{"status": "error", "error": "gloo timeout"}, {"status": "timeout", "error": "t"}]
    phase, _ = ranks.merge(bad, [{}, {}])
    assert (phase["status"], phase["error"]) == ("timeout", "rank 1: t")


@pytest.mark.parametrize(
    ("cause", "torch", "issues"),
    [
        ("crash", "2.15.0", ["ranks-allgather-bucketing-wrapper"]),
        ("hot-error", "2.13.0", ["ranks-allgather-bucketing-wrapper"]),
        ("timeout", "2.15.0", ["ranks-partial-hit-hang"]),
        ("hot-mismatch", "2.15.0", []),
        ("timeout", "2.12.0", []),
    ],
)
def test_known_rank_issues_match_rows_of_several_ranks_only(
    cause: str, torch: str, issues: list[str]
) -> None:
    from ci_fxcache.report import known_issues

    builtin = known_issues.load_builtin()
    row = {"ranks": 2, "verdict": "unsafe", "cause": cause, "device": "cuda"}
    assert [i.id for i in builtin if i.id.startswith("ranks-") and i.applies(row, torch)] == issues
    del row["ranks"]
    assert not [i.id for i in builtin if i.id.startswith("ranks-") and i.applies(row, torch)]


def test_reports_show_ranks_only_where_they_differ_from_one() -> None:
    import copy
    import json

    from ci_fxcache.commands.verify import line
    from ci_fxcache.report import known_issues, model, render
    from ci_fxcache.results import reader
    from tests.conftest import ROOT
    from tests.test_results_schema import validate

    doc = json.loads((ROOT / "tests" / "data" / "results_cpu.json").read_text())

    def markdown(doc: dict[str, Any]) -> str:
        validate(doc)
        loaded = reader.from_document(doc, "t")
        return render.markdown(model.build(loaded, known_issues.load_builtin()))

    assert "rank" not in markdown(doc) and "rank" not in line(doc["combos"][0])
    two = copy.deepcopy(doc["combos"][0])
    two.update(id=two["id"] + "-r2", ranks=2, reason="on rank 1: " + two["reason"])
    two["rank_verdicts"] = [
        {"rank": r, "verdict": two["verdict"], "cause": two["cause"], "reason": "r",
         "hits": two["hits"], "misses": two["misses"], "speedup": two["speedup"]}
        for r in (0, 1)
    ]  # fmt: skip
    doc["combos"].append(two)
    doc["matrix"]["ranks"] = ["1", "2"]
    md = markdown(doc)
    assert "**2 ranks**" in md and "**1 rank**" in md
    assert " 2 ranks " in line(two) and "on rank 1: " in line(two)


@pytest.mark.slow
def test_compile_on_one_rank_on_torch_2_15_loads_rank_0s_cache_on_every_rank(
    tmp_path: Path, run_fxcache: RunFxcache
) -> None:
    from tests.conftest import torch2_python

    proc, combo = verify_one(
        run_fxcache,
        tmp_path,
        *("--ranks", "2:one-rank", "--device", "cpu"),
        workload=MLP,
        phase="both",
        python=torch2_python(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert combo["id"].endswith("-r2-one-rank") and combo["rank_layout"] == "one-rank"
    assert (combo["verdict"], combo["cause"]) == ("safe", "hit"), combo["reason"]
    # rank 1 compiled cold into scratch: what it loads hot, rank 0 alone wrote
    assert all(p["counters"].get("fxgraph_cache_hit") for p in combo["hot"]["ranks"])


def test_compile_on_one_rank_is_skipped_on_a_torch_without_it(
    tmp_path: Path, run_fxcache: RunFxcache
) -> None:
    proc, combo = verify_one(
        run_fxcache, tmp_path, "--ranks", "2:one-rank", "--device", "cpu", phase="both"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (combo["verdict"], combo["cause"]) == ("skipped", "torch-too-old")
    assert combo["reason"] == "compile on one rank needs torch 2.15 (compile_on_one_rank)"


def test_ranks_on_cuda_take_one_device_each_all_at_once() -> None:
    from ci_fxcache.verify import matrix, runner

    class Server:
        info: dict[str, Any] = {  # noqa: RUF012
            "cuda_capabilities": [[9, 0], [9, 0], [7, 5]],
            "cuda_names": ["H100", "H100", "T4"],
        }

    settings = runner.Settings(cache_dir=Path("/nonexistent"), run_dir=Path("/nonexistent"))
    run = runner.Runner(Server(), settings, lambda _: None)  # type: ignore[arg-type]
    bf16 = matrix.Combo("mlp", "cuda", "bfloat16", "false", "fxgraph", True, ranks=2)
    taken = run.take_gpus(bf16)
    assert [s.name for s in taken] == ["H100", "H100"] and len({s.visible for s in taken}) == 2
    for slot in taken:
        run.give_gpu(slot)
    with pytest.raises(RuntimeError, match="fewer visible GPUs than ranks"):
        run.take_gpus(matrix.Combo("mlp", "cuda", "bfloat16", "false", "fxgraph", True, ranks=3))


def test_a_reference_of_several_ranks_counts_as_recorded(tmp_path: Path) -> None:
    """So that the next job (`--phase auto`) runs ranked combinations hot only."""
    from ci_fxcache.verify import ranks, versions

    (tmp_path / versions.REFERENCE).write_text("{}")
    assert not versions.has_reference(tmp_path)
    ranks.rank_dir(tmp_path, 0).mkdir()
    (ranks.rank_dir(tmp_path, 0) / versions.REFERENCE_TENSORS).write_bytes(b"")
    assert versions.has_reference(tmp_path) and ranks.rank_dir(tmp_path, 1).name == "rank1"
