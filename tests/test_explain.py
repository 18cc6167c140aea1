"""Explained misses: torch's own cache-key components recorded per phase, the differing ones named.

Real torch 2.13.0 compiles on the CPU in fresh processes that share one cache directory; each
hot process changes one thing that torch keys on and the explanation must name exactly that.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.verify import explain
from tests.conftest import ROOT, TORCH_PYTHON, torch2_python, torch_build

pytestmark = pytest.mark.slow

# One phase in a fresh process: compile `x.sin() @ y` forward and backward with the worker's
# key recorder installed, print what it recorded. argv: dtype, cache key tag, gemm backends.
PHASE = """
import json, os, sys
import torch
import torch._inductor.config as inductor_config
from ci_fxcache.worker import keyinfo
dtype, tag, backends = sys.argv[1:4]
keyinfo.install()
torch.compiler.config.cache_key_tag = tag
if backends:
    inductor_config.max_autotune_gemm_backends = backends
x = torch.rand(16, 32, dtype=getattr(torch, dtype), requires_grad=True)
y = torch.rand(32, 8, dtype=getattr(torch, dtype))
torch.compile(lambda a, b: a.sin() @ b)(x, y).sum().backward()
print(json.dumps({"keyinfo": keyinfo.collect("cpu")}))
"""


def phase(cache: Path, dtype: str = "float32", tag: str = "", backends: str = "") -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    proc = subprocess.run(
        [TORCH_PYTHON, "-c", PHASE, dtype, tag, backends],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    cache = tmp_path_factory.mktemp("explain") / "inductor"
    return cache, phase(cache)


def test_cold_phase_records_every_lookup_with_its_key_components(
    cold: tuple[Path, dict[str, Any]],
) -> None:
    lookups = cold[1]["keyinfo"]["lookups"]
    assert [(u["cache"], u["state"]) for u in lookups] == [
        ("aotautograd", "miss"),
        ("fxgraph", "miss"),
        ("fxgraph", "miss"),
    ]
    for lookup in lookups:
        assert lookup["key"]
        assert lookup["components"]["cache_key_tag"][1] == ""
        assert "inductor_config[max_autotune_gemm_backends]" in lookup["components"]
        assert lookup["components"]["torch_version"][1] is None  # binary: only its hash
    assert cold[1]["keyinfo"]["system"]["torch_version"].startswith("2.13.0")


def test_unchanged_hot_phase_hits_and_explains_nothing(cold: tuple[Path, dict[str, Any]]) -> None:
    hot = phase(cold[0])
    assert {u["state"] for u in hot["keyinfo"]["lookups"]} == {"hit"}
    why = explain.explain(cold[1], hot)
    assert why == {"differs": [], "misses": [], "uncacheable": []}


@pytest.mark.parametrize(
    ("change", "component", "was", "now"),
    [
        ({"tag": "other-tag"}, "TORCH_COMPILE_CACHE_KEY_TAG", "", "other-tag"),
        (
            {"backends": "ATEN"},
            "inductor config max_autotune_gemm_backends",
            "ATEN,TRITON,CPP",
            "ATEN",
        ),
        ({"dtype": "float64"}, "input 0 (dtype, shape, stride)", "float32", "float64"),
    ],
    ids=["key-tag", "config", "input-dtype"],
)
def test_a_hot_miss_names_the_component_that_changed(
    cold: tuple[Path, dict[str, Any]], change: dict[str, str], component: str, was: str, now: str
) -> None:
    hot = phase(cold[0], **change)
    why = explain.explain(cold[1], hot)
    assert why["misses"] and {m["state"] for m in why["misses"]} == {"miss"}
    named = {d["component"]: d for d in why["differs"]}
    assert component in named, why["differs"]
    assert was in str(named[component]["cold"]) and now in str(named[component]["hot"])
    if "dtype" not in change:  # only the changed setting: nothing else is blamed
        assert [d["component"] for d in why["differs"]] == [component]
    assert component in explain.summary(why)


# Counting through the real Triton entry point (3.9 with torch 2.15.0; 3.8 with 2.14.1):
# `triton.compile` for an explicit GPU target runs the whole compiler (to a cubin) without a GPU.
# A user listener that was already set must keep receiving every event.
TRITON = """
import json, os, tempfile
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
import triton, triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
import torch._inductor.config as inductor_config
from ci_fxcache.worker import triton_builds
users = []
knobs.compilation.listener = lambda **event: users.append(event["cache_hit"])
assert triton_builds.install(in_process=True)

@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)

sig = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"}
for block in (64, 64, 128):  # compile, Triton cache hit, compile
    triton.compile(ASTSource(add, sig, {"BLOCK": block}), target=GPUTarget("cuda", 90, 32))
print(json.dumps({**triton_builds.evidence(), "users": users,
                  "compile_threads": inductor_config.compile_threads}))
"""


def test_triton_compilations_are_counted_through_tritons_listener(tmp_path: Path) -> None:
    script = tmp_path / "count_triton.py"  # @triton.jit needs its source in a file
    script.write_text(TRITON)
    proc = subprocess.run(
        [torch2_python(), str(script)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["triton_kernels_built"] == 2  # the cache hit is not a build
    assert all(b.startswith("triton add at ") for b in got["triton_kernel_builds"])
    assert got["users"] == [False, True, False]
    assert got["compile_threads"] == 1


def test_triton_is_not_counted_where_it_is_not_installed() -> None:
    # A CPU build of torch comes without Triton; a CUDA build brings it: there it is hidden
    # (an import of it fails as a missing module's does).
    hide = "import sys; sys.modules['triton'] = None; " if torch_build().triton else ""
    proc = subprocess.run(
        [
            TORCH_PYTHON,
            "-c",
            f"{hide}from ci_fxcache.worker import triton_builds as t; "
            "print(t.install(in_process=True), t.evidence())",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert proc.stdout.split() == ["False", "{}"]


# End to end through `fxcache verify`: the explanation lands in the results document, the text
# output and the markdown report.
STATIC = ("--dtypes", "float32", "--dynamic", "false", "--mechanisms", "fxgraph")


@pytest.fixture(scope="module")
def cold_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import run_fxcache
    from tests.test_verify import verify

    cache = tmp_path_factory.mktemp("explain-e2e") / "cache"
    proc = verify(
        run_fxcache.__wrapped__(),  # type: ignore[attr-defined]
        *STATIC,
        "--training",
        "false",
        "--phase",
        "cold",
        "--cache-dir",
        str(cache),
    )
    assert proc.returncode == 0, proc.stderr
    return cache


@pytest.mark.parametrize(
    ("env", "component", "hot_value"),
    [
        ({"TORCH_COMPILE_CACHE_KEY_TAG": "release-2"}, "TORCH_COMPILE_CACHE_KEY_TAG", "release-2"),
        (
            {"TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS": "ATEN"},
            "inductor config max_autotune_gemm_backends",
            "ATEN",
        ),
    ],
    ids=["key-tag", "config"],
)
def test_verify_explains_a_hot_miss_in_json_text_and_markdown(
    cold_cache: Path,
    run_fxcache: Any,
    tmp_path: Path,
    env: dict[str, str],
    component: str,
    hot_value: str,
) -> None:
    from tests.test_verify import load, verify

    cache = tmp_path / "cache"
    shutil.copytree(cold_cache, cache)
    out = tmp_path / "hot.json"
    proc = verify(
        run_fxcache,
        *STATIC,
        "--training",
        "false",
        "--phase",
        "hot",
        "--cache-dir",
        str(cache),
        "--json",
        str(out),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    (combo,) = load(out)["combos"]
    assert combo["verdict"] == "no-gain" and combo["cause"] == "miss", combo["reason"]
    assert [d["component"] for d in combo["explain"]["differs"]] == [component]
    assert combo["explain"]["differs"][0]["hot"] == hot_value
    assert {m["cache"] for m in combo["explain"]["misses"]} == {"aotautograd", "fxgraph"}
    assert component in proc.stdout
    markdown = run_fxcache("report", str(out), "--format", "md")
    # the report's why column (markdown-escaped and with <wbr> break opportunities, both removed)
    plain = markdown.stdout.replace("\\", "").replace("<wbr>", "")
    assert f"the cache missed: {component} differs" in plain


def test_a_graph_aotautograd_never_caches_is_a_partial_hit_named_in_notes(
    run_fxcache: Any, tmp_path: Path
) -> None:
    """Selective activation checkpointing: AOTAutograd bypasses its cache in both phases."""
    from tests.test_verify import load, verify

    out = tmp_path / "r.json"
    proc = verify(
        run_fxcache,
        *STATIC,
        "--training",
        "true",
        "--workloads",
        "tests.workloads.uncacheable:selective_checkpoint",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    (combo,) = load(out)["combos"]
    assert combo["cold"]["counters"]["aot_autograd_cache_bypass"] == 1
    assert combo["hot"]["counters"]["aot_autograd_cache_bypass"] == 1
    assert combo["hot"]["counters"]["fxgraph_cache_hit"] == 2
    assert combo["hot"]["kernels_built"] == 0
    assert combo["verdict"] == "safe" and combo["cause"] == "partial-hit", combo["reason"]
    (note,) = combo["notes"]
    assert note["kind"] == "uncacheable"
    assert note["text"].startswith("AOTAutograd cache bypass")
    assert "SAC context_fn does not have a cache_hash attribute" in note["text"]
    assert "explain" not in combo


# judge() on recorded evidence: the decisions that rest on explain() and the Triton count.
SETTINGS = {"compare": "bitwise", "min_speedup": 2.0}
COMBO_ARGS = {"dtype": "float32", "mechanism": "fxgraph"}
SAME = {"vs_cold": {"bitwise": True, "close": True, "max_abs_err": 0.0, "detail": ""}}


def _evidence(counters: dict[str, int], compile_s: float, **extra: Any) -> dict[str, Any]:
    return {
        "status": "ok",
        "compile_s": compile_s,
        "counters": counters,
        "kernels_built": 0,
        **extra,
    }


def _lookup(cache: str, state: str, reason: str = "") -> dict[str, Any]:
    lookup: dict[str, Any] = {"cache": cache, "state": state, "key": f"{cache}-{state}"}
    lookup["components"] = {"cache_key_tag": ["h0", ""], "gm": ["h1", "def forward..."]}
    if reason:
        lookup["bypass_reason"] = reason
    return lookup


def test_a_triton_rebuild_on_hot_load_is_no_gain_with_the_count() -> None:
    from ci_fxcache.verify import verdicts

    hits = {"fxgraph_cache_hit": 2, "aot_autograd_cache_hit": 1}
    hot = _evidence(hits, 1.0, triton_kernels_built=3)
    judged = verdicts.judge(COMBO_ARGS, _evidence({}, 20.0), hot, {}, SAME, SETTINGS)
    assert judged["verdict"] == "no-gain" and judged["cause"] == "rebuilt"
    assert judged["explain"]["kernels"] == {"cpp": 0, "triton": 3}
    assert "rebuilt 3 Triton kernels" in judged["reason"]


def test_a_bypass_the_cold_phase_did_not_have_is_a_miss_not_a_partial_hit() -> None:
    from ci_fxcache.verify import verdicts

    cold = {"keyinfo": {"lookups": [_lookup("fxgraph", "miss"), _lookup("fxgraph", "miss")]}}
    hot_lookups = [_lookup("fxgraph", "hit"), _lookup("fxgraph", "bypass", "Can't cache cond")]
    counters = {"fxgraph_cache_hit": 1, "fxgraph_cache_bypass": 1}

    def judge() -> dict[str, Any]:
        hot = {**SAME, "keyinfo": {"lookups": hot_lookups}}
        return verdicts.judge(
            COMBO_ARGS, _evidence({}, 20.0), _evidence(counters, 1.0), cold, hot, SETTINGS
        )

    judged = judge()
    assert judged["verdict"] == "no-gain" and judged["cause"] == "miss"
    assert judged["explain"]["misses"] == [
        {
            "cache": "fxgraph",
            "state": "bypass",
            "key": "fxgraph-bypass",
            "bypass_reason": "Can't cache cond",
        }
    ]
    assert not [n for n in judged["notes"] if n["kind"] == "uncacheable"]
    # The same bypass in the cold phase too: a part torch never caches, judged by the work done.
    cold["keyinfo"]["lookups"][1] = _lookup("fxgraph", "bypass", "Can't cache cond")
    judged = judge()
    assert judged["verdict"] == "safe" and judged["cause"] == "partial-hit", judged["reason"]
    assert judged["notes"] == [
        {
            "kind": "uncacheable",
            "text": "FX graph cache bypass (cold and hot alike): Can't cache cond",
        }
    ]


def test_a_gpu_change_is_named_once_from_the_system_facts_and_the_fx_key() -> None:
    def result(gpu: str, state: str) -> dict[str, Any]:
        lookup = _lookup("fxgraph", state)
        lookup["components"]["system_info[device]"] = ["h-" + gpu, str({"name": gpu})]
        system = {"python_version": "3.11.7", "torch_version": "2.14.1", "gpu_name": gpu}
        return {"keyinfo": {"lookups": [lookup], "system": system}}

    why = explain.explain(result("NVIDIA H200", "miss"), result("NVIDIA H100 80GB HBM3", "miss"))
    assert why["differs"] == [
        {
            "component": "GPU name",
            "cold": "NVIDIA H200",
            "hot": "NVIDIA H100 80GB HBM3",
            "why": explain.NOT_IN_SCOPE["GPU name"],
        }
    ]


def test_a_miss_on_a_field_the_scope_leaves_out_says_why() -> None:
    """The scope keys the Python ABI (cp312); caching precompile refuses another patch
    release, so a miss between 3.12.3 and 3.12.4 inside one scope is named with that reason."""

    def result(python: str) -> dict[str, Any]:
        lookup = _lookup("fxgraph", "hit")
        system = {"python_version": python, "torch_version": "2.14.1", "gpu_name": "NVIDIA H200"}
        return {"keyinfo": {"lookups": [lookup], "system": system}}

    why = explain.explain(result("3.12.3"), result("3.12.4"))
    assert [d["component"] for d in why["differs"]] == ["Python version"]
    assert explain.summary(why) == (
        "Python version '3.12.3' -> '3.12.4': caching precompile refuses other Python "
        "versions; the scope keys only the ABI (cp312), not the patch release"
    )
    # A component the scope keys itself carries no such reason.
    cold, hot = result("3.12.3"), result("3.12.3")
    hot["keyinfo"]["system"]["torch_version"] = "2.14.2"
    assert explain.explain(cold, hot)["differs"] == [
        {"component": "torch version", "cold": "2.14.1", "hot": "2.14.2"}
    ]


def test_a_hot_miss_on_a_graph_the_cold_phase_never_saved_is_a_partial_hit() -> None:
    # Seen on every built-in workload with dynamic=true in training (torch 2.13.0, CPU): the
    # cold phase looks up two AOTAutograd keys and saves one; the hot phase hits that one and
    # misses the other, building no kernel. The same miss as cold's is not a lost entry.
    from ci_fxcache.verify import verdicts

    def aot(state: str, key: str) -> dict[str, Any]:
        return {**_lookup("aotautograd", state), "key": key}

    fx_hits = [_lookup("fxgraph", "hit"), _lookup("fxgraph", "hit")]
    cold_counters = {"aot_autograd_cache_miss": 2, "aot_autograd_cache_saved": 1}
    hot_counters = {"fxgraph_cache_hit": 2, "aot_autograd_cache_hit": 1}
    hot_counters["aot_autograd_cache_miss"] = 1

    def judge(saved: int, hot_miss_key: str) -> dict[str, Any]:
        cold = {
            "counters": {**cold_counters, "aot_autograd_cache_saved": saved},
            "keyinfo": {"lookups": [aot("miss", "k-saved"), aot("miss", "k-unsaved")]},
        }
        hot = {
            **SAME,
            "keyinfo": {"lookups": [*fx_hits, aot("hit", "k-saved"), aot("miss", hot_miss_key)]},
        }
        return verdicts.judge(
            COMBO_ARGS, _evidence({}, 20.0), _evidence(hot_counters, 1.0), cold, hot, SETTINGS
        )

    judged = judge(saved=1, hot_miss_key="k-unsaved")
    assert (judged["verdict"], judged["cause"]) == ("safe", "partial-hit"), judged["reason"]
    (note,) = [n for n in judged["notes"] if n["kind"] == "uncacheable"]
    assert "never saved" in note["text"] and "AOTAutograd" in note["text"]
    # Every cold miss was saved: a hot miss on one of them is a lost entry, a real miss.
    judged = judge(saved=2, hot_miss_key="k-unsaved")
    assert (judged["verdict"], judged["cause"]) == ("no-gain", "miss")
    # A key the cold phase never looked up is a real miss too.
    judged = judge(saved=1, hot_miss_key="k-new")
    assert (judged["verdict"], judged["cause"]) == ("no-gain", "miss")
