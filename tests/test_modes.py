"""The compile-mode axis (`--modes`, action input `modes:`): ids, labels, skips, reports.
Fast tests here; the real max-autotune compiles are in tests/test_modes_compile.py."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.report import labels
from ci_fxcache.verify import matrix, runner
from tests.conftest import ROOT, RunFxcache


def _combo(mode: str, mechanism: str = "fxgraph", device: str = "cpu") -> matrix.Combo:
    return matrix.Combo("mlp", device, "float32", "false", mechanism, False, mode)


def test_the_default_mode_keeps_every_id_and_label() -> None:
    plain = matrix.Combo("mlp", "cpu", "float32", "false", "fxgraph", False)
    assert plain.mode == "default"
    assert plain.id == "mlp-cpu-float32-static-fxgraph-infer"
    assert _combo("max-autotune").id == "mlp-cpu-float32-static-fxgraph-infer-max-autotune"
    assert _combo("max-autotune").label.endswith("fxgraph infer max-autotune")
    assert plain.to_dict()["mode"] == "default"


def test_each_mode_is_its_own_combination_with_its_own_cold_phase() -> None:
    built = matrix.build({"modes": "default,max-autotune", "mechanisms": "fxgraph,mega",
                          "dtypes": "float32", "dynamic": "false"}, None)  # fmt: skip
    combos = built.combos()
    assert [c.mode for c in combos] == ["default", "max-autotune"] * 2
    assert len({c.id for c in combos}) == 4
    groups = runner.cold_groups(combos, share=True)
    assert sorted(len(g) for g in groups) == [2, 2]  # fxgraph+mega share, per mode
    assert all(len({c.mode for c in g}) == 1 for g in groups)
    assert built.to_dict()["modes"] == ["default", "max-autotune"]


def test_an_unknown_mode_is_refused_naming_the_modes(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache("plan", "--modes", "fast")
    assert proc.returncode == 2
    assert "unknown mode value 'fast'; choose from " + ", ".join(matrix.MODES) in proc.stderr


def test_reduce_overhead_on_the_cpu_is_skipped_naming_the_graphs() -> None:
    skip = runner.mode_skip(_combo("reduce-overhead"))
    assert skip is not None and skip.cause == "unsupported"
    assert "CUDA graphs" in skip.reason and "default mode" in skip.reason
    assert runner.mode_skip(_combo("reduce-overhead", device="cuda")) is None
    assert runner.mode_skip(_combo("max-autotune")) is None  # real on the CPU
    assert runner.mode_skip(_combo("default", mechanism="aot")) is None
    artifact = runner.mode_skip(_combo("max-autotune", mechanism="aot"))
    assert artifact is not None and "default mode only" in artifact.reason


def _doc_with_modes(modes: list[str]) -> dict[str, Any]:
    doc = json.loads((ROOT / "tests/data/results_cpu.json").read_text())
    combos = [c for c in doc["combos"] if c["verdict"] != "skipped"][:2]
    out = []
    for mode in modes:
        for c in combos:
            c = copy.deepcopy(c)
            c["mode"] = mode
            c["id"] += matrix.mode_suffix(mode, "-")
            out.append(c)
    doc["combos"] = out
    return doc


def test_reports_name_the_mode_only_where_modes_differ() -> None:
    from ci_fxcache import report
    from ci_fxcache.report import render

    plain = render.text(report.from_document(_doc_with_modes(["default"]), "t"))
    assert "default" not in plain and "max-autotune" not in plain
    mixed_doc = _doc_with_modes(["default", "max-autotune"])
    mixed = render.text(report.from_document(mixed_doc, "t"))
    assert "[default]" in mixed or "default" in mixed
    assert "max-autotune" in mixed
    md = render.markdown(report.from_document(mixed_doc, "t"))
    assert "max-autotune" in md
    only = render.text(report.from_document(_doc_with_modes(["max-autotune"]), "t"))
    assert "max-autotune" in only  # the one mode chosen, said once in the heading
    assert labels.varying_fields(mixed_doc["combos"]) == ("mode",)


@pytest.mark.parametrize("doc", ["action.yml"])
def test_the_action_declares_modes(doc: str) -> None:
    import yaml

    inputs = yaml.safe_load((ROOT / doc).read_text())["inputs"]
    assert "modes" in inputs and inputs["modes"]["default"] == ""


def test_a_hot_process_that_autotuned_again_is_no_gain_naming_it_and_its_seconds() -> None:
    from tests.test_verdicts import HIT, _phase, judge

    tuned = {"counters": {"select_algorithm_autotune": 3}, "s": 41.2}
    found = judge(hot=_phase(compile_s=45.0, counters=HIT, autotune=tuned))
    assert (found["verdict"], found["cause"]) == ("no-gain", "autotuned")
    assert found["reason"].startswith("autotuning ran again in the hot process: 41 s")
    # a cold phase that autotuned is what max-autotune does: no finding
    assert judge(cold=_phase(autotune=tuned))["cause"] == "hit"
    # a crash still outranks it
    crashed = judge(hot=_phase(status="crash", signal="SIGSEGV", autotune=tuned))
    assert crashed["verdict"] == "unsafe"


def test_the_worker_reads_autotuning_from_torchs_counters_and_timers() -> None:
    """What torch records (2.13 and 2.15 alike) becomes the phase's `autotune` evidence."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    from ci_fxcache.worker import phase

    counters.clear()
    assert phase.autotune_evidence() is None
    counters["inductor"]["select_algorithm_autotune"] += 2
    counters["inductor"]["fxgraph_cache_hit"] += 1  # not autotuning
    compilation_time_metrics["mm_template_autotuning"] = [3.5, 1.0]
    compilation_time_metrics["compile_file"] = [9.0]  # not autotuning
    try:
        assert phase.autotune_evidence() == {
            "counters": {"select_algorithm_autotune": 2},
            "s": 4.5,
        }
    finally:
        counters.clear()
        compilation_time_metrics.pop("mm_template_autotuning", None)
        compilation_time_metrics.pop("compile_file", None)


def test_a_factory_names_compile_options_checked_and_part_of_the_identity() -> None:
    import torch

    from ci_fxcache.worker import identity, workloads

    work = workloads.build("tests.workloads.modes:tiny_mlp_options", torch.float32, "cpu")
    assert work.compile == {
        "fullgraph": True,
        "options": {"max_autotune_gemm_backends": "CPP,ATEN"},
    }
    assert workloads.build("tests.workloads.modes:tiny_mlp", torch.float32, "cpu").compile == {}
    for bad, words in (
        ({"mode": "max-autotune"}, "the matrix sets it (--modes)"),
        ({"dynamic": True}, "the matrix sets it (--dynamic)"),
        ({"fulgraph": True}, "unknown key 'fulgraph'"),
        ({"fullgraph": "yes"}, "fullgraph must be a bool"),
        ({"options": {"f": object()}}, "plain values"),
        ([], "'compile' must be a dict"),
    ):
        with pytest.raises(workloads.WorkloadError, match=re.escape(words)):
            workloads.compile_options(bad, "w")
    recorded = {k: "x" for k in identity.EXACT}
    recorded["compile"] = identity.compile_digest({})
    changed = {**recorded, "compile": identity.compile_digest({"fullgraph": True})}
    assert identity.exact_change(recorded, changed) == "its torch.compile options changed"
    older = {k: v for k, v in recorded.items() if k != "compile"}  # before compile options
    assert identity.exact_change(older, recorded) is None
    assert identity.exact_change(older, changed) == "its torch.compile options changed"


AUTOTUNE_PATHS = """
import json, os
from torch._inductor.codecache import CacheBase
from torch._inductor.runtime.runtime_utils import cache_dir
from torch._inductor.runtime import autotune_cache
print(json.dumps({"local": str(CacheBase.get_local_cache_path()), "kernels": cache_dir(),
                  "best_config": hasattr(autotune_cache, "AutotuneCache")}))
"""


def test_the_autotune_caches_live_in_the_scope_fxcache_restores(
    torch_python: str, tmp_path: Path
) -> None:
    """Inductor keeps what it tuned in its local cache (`cache/` under the cache dir) and next
    to each Triton kernel (`.best_config`, under the cache dir too): both inside
    TORCHINDUCTOR_CACHE_DIR, the directory fxcache restores and saves; the Redis mechanism
    turns on torch's autotune remote cache beside the FX graph one."""
    import subprocess

    from ci_fxcache.store.remote import redis_cache

    scope = tmp_path / "inductor"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(scope)}
    proc = subprocess.run([torch_python, "-c", AUTOTUNE_PATHS], env=env, capture_output=True,
                          text=True, check=False, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    paths = json.loads(proc.stdout.splitlines()[-1])
    assert Path(paths["local"]).is_relative_to(scope)
    assert Path(paths["kernels"]) == scope and paths["best_config"]
    assert redis_cache.job_env("redis://h")["TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE"] == "1"


def test_cuda_graph_capture_is_timed_apart_only_where_cuda_runs_the_graphs() -> None:
    """The capture time comes from torch's CUDA graph tree timers; on the CPU torch skips the
    graphs, so nothing is recorded there (the GPU path runs in benchmarks/gpu_check.sh)."""
    import torch
    from torch._dynamo.utils import compilation_time_metrics

    from ci_fxcache.worker import phase

    compilation_time_metrics["CUDAGraphNode.record"] = [0.75]
    try:
        assert phase.cudagraph_capture_s("cpu") is None
        if not torch.cuda.is_available():
            assert phase.cudagraph_capture_s("cuda") is None
            pytest.skip("no CUDA here: the capture time is read on a GPU runner")
        assert phase.cudagraph_capture_s("cuda") == 0.75
    finally:
        compilation_time_metrics.pop("CUDAGraphNode.record", None)
