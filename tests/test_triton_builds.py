"""Every Triton build counted, or said to be uncounted: Triton >= 3.4's listener, the cache
listing for older Triton, Triton's own C modules (cuda_utils*.so), and a note where counting is
not possible. A stand-in `triton` package (a module dir with a given __version__, on sys.path)
and fake TRITON_CACHE_DIR trees stand in for a GPU."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from torch._dynamo.utils import counters  # before any stand-in triton is importable

from ci_fxcache.verify import verdicts
from ci_fxcache.verify.forkserver import Outcome
from ci_fxcache.worker import triton_builds

HIT = {"fxgraph_cache_hit": 2, "aot_autograd_cache_hit": 1}


@pytest.fixture(autouse=True)
def _no_stand_in_left() -> Any:
    """Take the stand-in `triton` out of sys.modules after each test (monkeypatch only restores
    the entries it changed, not the modules an import added)."""
    before = {m: sys.modules[m] for m in list(sys.modules) if m.split(".")[0] == "triton"}
    yield
    for name in [m for m in list(sys.modules) if m.split(".")[0] == "triton"]:
        del sys.modules[name]
    sys.modules.update(before)


def _fake_triton(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, knobs: bool) -> Any:
    pkg = tmp_path / "site" / "triton"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
    if knobs:
        (pkg / "knobs.py").write_text(
            "class _Compilation:\n    listener = None\n\ncompilation = _Compilation()\n"
        )
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.setattr(triton_builds, "_INSTALLED", [])
    import triton

    assert triton.__version__ == version
    return triton


def _kernel(cache: Path, digest: str, name: str, ext: str = ".cubin") -> None:
    d = cache / digest
    d.mkdir(parents=True, exist_ok=True)
    for suffix in (ext, ".json", ".ttir", ".ptx"):
        (d / f"{name}{suffix}").write_bytes(b"x")


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    path = tmp_path / "triton-cache"
    _kernel(path, "a" * 8, "triton_poi_old")  # there before the phase: not counted
    (path / ("b" * 8)).mkdir()
    (path / ("b" * 8) / "cuda_utils.cpython-312-x86_64-linux-gnu.so").write_bytes(b"elf")
    return path


@pytest.mark.parametrize("version", ["3.2.0", "3.3.1"])
def test_older_triton_counts_new_kernel_binaries_in_the_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path, version: str
) -> None:
    _fake_triton(tmp_path, monkeypatch, version, knobs=False)
    assert triton_builds.install(in_process=True, cache_dir=cache, device="cuda") is False
    _kernel(cache, "c" * 8, "triton_red_fused_sum_0")
    _kernel(cache, "d" * 8, "triton_poi_fused_sin_1", ".hsaco")
    got = triton_builds.evidence()
    assert got["triton_count"] == "cache-listing"
    assert got["triton_kernels_built"] == 2
    assert "triton_uncounted" not in got
    assert got["triton_driver_builds"] == []  # cuda_utils was already there


def test_the_driver_module_build_is_counted_beside_the_listener(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton = _fake_triton(tmp_path, monkeypatch, "3.6.0", knobs=True)
    empty = tmp_path / "hot-triton"  # mega and precompile hot phases start from an empty dir
    assert triton_builds.install(cache_dir=empty, device="cuda") is True
    empty.mkdir()
    (empty / "e1").mkdir()
    (empty / "e1" / "cuda_utils.so").write_bytes(b"elf")
    (empty / "e2").mkdir()
    (empty / "e2" / "__triton_launcher.cpython-312-x86_64-linux-gnu.so").write_bytes(b"elf")
    _kernel(empty, "f" * 8, "triton_poi_loaded")  # a cache file, but no compile: not counted
    triton.knobs.compilation.listener(src=None, cache_hit=True)
    triton.knobs.compilation.listener(src=None, cache_hit=False)
    got = triton_builds.evidence()
    assert (got["triton_count"], got["triton_kernels_built"]) == ("listener", 1)
    assert sorted(got["triton_driver_builds"]) == [
        "__triton_launcher.cpython-312-x86_64-linux-gnu.so",
        "cuda_utils.so",
    ]


def test_bundled_kernels_make_the_listing_uncounted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    _fake_triton(tmp_path, monkeypatch, "3.3.1", knobs=False)
    triton_builds.install(cache_dir=cache, device="cuda")
    _kernel(cache, "c" * 8, "triton_from_the_bundle")
    monkeypatch.setitem(counters["inductor"], triton_builds.BUNDLER_COUNTER, 4)
    got = triton_builds.evidence()
    assert "triton_kernels_built" not in got
    assert "Triton 3.3.1 has no compilation listener" in got["triton_uncounted"]


def test_no_triton_in_a_cuda_phase_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    triton_builds.install(cache_dir=cache, device="cuda")
    assert "no Triton" in triton_builds.evidence()["triton_uncounted"]
    triton_builds.install(cache_dir=cache, device="cpu")
    assert triton_builds.evidence() == {}  # a CPU phase compiles no Triton


def _judge(hot_extra: dict[str, Any]) -> dict[str, Any]:
    cold: dict[str, Any] = {"status": "ok", "compile_s": 10.0, "counters": {}}
    hot: dict[str, Any] = {"status": "ok", "compile_s": 1.0, "counters": HIT, **hot_extra}
    combo: dict[str, Any] = {"workload": "w", "device": "cuda", "dtype": "float32"}
    combo |= {"dynamic": "false", "mechanism": "mega", "training": False}
    settings: dict[str, Any] = {"compare": "bitwise", "min_speedup": 2.0}
    vs_cold = {"max_abs_err": 0.0, "bitwise": True, "close": True, "detail": ""}
    return verdicts.judge(combo, cold, hot, {}, {"vs_cold": vs_cold}, settings)


def test_kernels_counted_from_the_listing_make_a_rebuilt_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "c"
    _fake_triton(tmp_path, monkeypatch, "3.2.0", knobs=False)
    triton_builds.install(cache_dir=cache, device="cuda")
    _kernel(cache, "c" * 8, "triton_rebuilt")
    result = {"status": "ok", "compile_s": 1.0, **triton_builds.evidence()}
    phase = verdicts.evidence(Outcome(result, 0, None, False, ""), 600.0)
    assert phase["triton_count"] == "cache-listing"
    judged = _judge({k: v for k, v in phase.items() if k.startswith("triton_")})
    assert (judged["verdict"], judged["cause"]) == ("no-gain", "rebuilt"), judged["reason"]
    assert "1 Triton" in judged["reason"]


def test_uncounted_and_driver_builds_are_notes() -> None:
    judged = _judge(
        {
            "triton_uncounted": "Triton builds not counted: ...",
            "triton_driver_builds": ["cuda_utils.so"],
        }
    )
    assert judged["verdict"] == "safe"
    assert [n["kind"] for n in judged["notes"]] == ["triton-uncounted", "triton-driver-built"]
    assert "cuda_utils.so" in judged["notes"][1]["text"]
