"""Why every scope keys the CPU ISA, GPU builds' too: torch's FX graph key does not hold it.

A CPU graph compiled where Inductor picks AVX-512 is a cache *hit* in a process where it picks
AVX2 (the same host with ATEN_CPU_CAPABILITY=avx2 stands in for an AVX2-only runner), and the
hot-loaded kernels then compute wrong values or fail to build. Runs on the second torch (2.15.0;
measured first with 2.14.1), the CUDA build: a GPU build's scope also holds the CPU compiles of
`--device auto`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ci_fxcache.env import cpu
from tests.conftest import torch2_python

pytestmark = pytest.mark.slow

PHASE = """
import json, torch
from torch._dynamo.utils import counters
torch.manual_seed(0)
x, y = torch.rand(1000, 37), torch.rand(37, 1000)
fn = lambda a, b: (a.sin() * 3 + a.cos()).sum(1) + (b.t() * 2).exp().sum(1)
err = (torch.compile(fn)(x, y) - fn(x, y)).abs().max().item()
print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"], "max_abs_err": err}))
"""


def _phase(cache: Path, capability: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    env.pop("ATEN_CPU_CAPABILITY", None)
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    return subprocess.run(
        [torch2_python(), "-c", PHASE],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_an_fx_graph_from_an_avx512_host_hits_and_goes_wrong_on_avx2(tmp_path: Path) -> None:
    found = cpu.supported_isas(cpu.CPUINFO.read_text(errors="replace"), os.uname().machine)
    if not {"avx512", "avx2"} <= set(found):
        pytest.skip(f"needs an x86 CPU with AVX-512 and AVX2 (this one offers {found or 'none'})")
    cold = _phase(tmp_path, None)
    assert cold.returncode == 0, cold.stderr[-2000:]
    assert json.loads(cold.stdout.splitlines()[-1])["max_abs_err"] < 1e-3
    hot = _phase(tmp_path, "avx2")
    if hot.returncode != 0:  # the AVX-512 kernels do not even build for AVX2
        assert "CppCompileError" in hot.stderr, hot.stderr[-2000:]
        return
    seen = json.loads(hot.stdout.splitlines()[-1])
    assert seen["hits"] >= 1  # torch's key did not tell the ISAs apart
    assert seen["max_abs_err"] > 1e-3, seen  # and the loaded kernels are wrong
