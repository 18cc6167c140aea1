"""Explained misses: torch's own cache-key components recorded per phase, the differing ones named.

Real torch 2.13.0 compiles on the CPU in fresh processes that share one cache directory; each
hot process changes one thing that torch keys on and the explanation must name exactly that.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.verify import explain
from tests.conftest import ROOT, TORCH_PYTHON

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
print(json.dumps({"keyinfo": keyinfo.collect()}))
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
