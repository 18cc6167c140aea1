"""The artifact mechanisms end to end: `aot` (`aot_compile` + `save_compiled_function` /
`load_compiled_function`) on each real torch and torch 2.15's `precompile-api` (`capture` /
`load`), judged like the caches (a cold process writes the artifact, a fresh hot process loads
it), with fault injection: a tampered artifact that computes other values is `unsafe`; one
that torch refuses, and that a compile replaces, is `no-gain` / `refused`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    TORCH2_VERSION,
    TORCH_PYTHON,
    RunFxcache,
    torch2_python,
    torch_build,
)
from tests.faults import tamper_sine, truncate
from tests.test_verify import _run_once, _shared, load, verify

pytestmark = pytest.mark.slow

AOT = "sin_matmul-cpu-float32-static-aot-train"
PRECOMPILE = "sin_matmul-cpu-float32-static-precompile-api-train"
AXES = ("--dtypes", "float32", "--dynamic", "false", "--training", "true")

ArtifactRun = tuple[subprocess.CompletedProcess[str], dict[str, Any], Path, str]


def _artifact_run(tmp_path_factory: pytest.TempPathFactory, python: str) -> ArtifactRun:
    """aot and precompile-api (skipped before torch 2.15), cold + hot, once per torch."""
    root = _shared(tmp_path_factory, "verify-artifacts" + ("" if python == TORCH_PYTHON else "-2"))
    out = root / "results.json"
    proc = _run_once(
        root,
        *AXES,
        *("--mechanisms", "aot,precompile-api"),
        *("--cache-dir", str(root / "cache"), "--json", str(out)),
        python=python,
    )
    return proc, load(out) if out.exists() else {}, root / "cache", python


@pytest.fixture(scope="module")
def artifact_run(tmp_path_factory: pytest.TempPathFactory, torch_python: str) -> ArtifactRun:
    """The artifact mechanisms on each real torch (2.13.0 and 2.15.0)."""
    return _artifact_run(tmp_path_factory, torch_python)


@pytest.fixture(scope="module")
def newest_run(tmp_path_factory: pytest.TempPathFactory) -> ArtifactRun:
    """The same run on torch 2.15.0 (shared with `artifact_run`'s: compiled once)."""
    return _artifact_run(tmp_path_factory, torch2_python())


def _combo(doc: dict[str, Any], combo_id: str) -> dict[str, Any]:
    (combo,) = [c for c in doc["combos"] if c["id"] == combo_id]
    return combo


def _loaded_and_equal(combo: dict[str, Any], files: tuple[str, ...], cache: Path) -> None:
    """A cold process wrote the artifact; a fresh hot process loaded it and computed the same
    bits, compiling no graph. On the CPU the artifact holds the kernels' C++ source, not the
    built libraries (as mega-cache does), so the load builds them again: no-gain, rebuilt."""
    assert combo["cold"]["artifact"]["file"] == ", ".join(files)
    assert all((cache / combo["id"] / name).is_file() for name in files)
    hot = combo["hot"]["artifact"]
    assert hot["loaded"] is True and "refused" not in hot, hot
    assert hot["bytes"] > 1000 and hot["compiled_graphs"] == 0 == hot["traced_graphs"]
    assert combo["cold"]["artifact"]["compiled_graphs"] >= 1
    assert combo["max_abs_err"]["hot_vs_cold"] == 0.0
    assert combo["cold"]["pid"] != combo["hot"]["pid"]
    assert (combo["verdict"], combo["cause"]) == ("no-gain", "rebuilt"), combo["reason"]
    assert combo["hot"]["kernels_built"] >= 1


def test_aot_and_precompile_api_are_judged_on_each_torch(artifact_run: ArtifactRun) -> None:
    proc, doc, cache, python = artifact_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _loaded_and_equal(_combo(doc, AOT), ("aot.bin",), cache)
    precompile = _combo(doc, PRECOMPILE)
    if python == TORCH_PYTHON:
        assert (precompile["verdict"], precompile["cause"]) == ("skipped", "torch-too-old")
        assert (
            "torch 2.14's callable torch.compiler.precompile(fn, *inputs) is not supported"
            in (precompile["reason"])
        )
        assert precompile["reason"].endswith(f"this is torch {torch_build().version}")
    else:
        assert doc["fingerprint"]["torch_version"].startswith(TORCH2_VERSION)
        files = ("precompile-api.py", "precompile-api.cache")
        _loaded_and_equal(precompile, files, cache)


def _hot(
    run_fxcache: RunFxcache, run: ArtifactRun, combo_id: str, tmp_path: Path, fault: Any
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """A hot-only run on a copy of `combo_id`'s directory after `fault(directory)`."""
    _, _, cache, python = run
    shutil.copytree(cache / combo_id, tmp_path / "cache" / combo_id)
    fault(tmp_path / "cache" / combo_id)
    mechanism = "aot" if combo_id == AOT else "precompile-api"
    out = tmp_path / "hot.json"
    proc = verify(
        run_fxcache,
        *AXES,
        *("--mechanisms", mechanism, "--phase", "hot"),
        *("--cache-dir", str(tmp_path / "cache"), "--json", str(out)),
        python=python,
    )
    (combo,) = load(out)["combos"]
    return proc, combo


def test_a_tampered_aot_artifact_is_unsafe(
    artifact_run: ArtifactRun, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    changed: list[int] = []
    proc, combo = _hot(
        run_fxcache,
        artifact_run,
        AOT,
        tmp_path,
        lambda d: changed.append(tamper_sine(d / "aot.bin")),
    )
    assert changed[0] >= 1
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (combo["verdict"], combo["cause"]) == ("unsafe", "hot-mismatch"), combo["reason"]
    assert combo["hot"]["artifact"]["loaded"] is True  # torch took it: only the values tell
    assert combo["max_abs_err"]["hot_vs_cold"] > 0.1


def test_a_truncated_aot_artifact_is_refused_and_compiled_not_unsafe(
    newest_run: ArtifactRun, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    proc, combo = _hot(run_fxcache, newest_run, AOT, tmp_path, lambda d: truncate(d / "aot.bin"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (combo["verdict"], combo["cause"]) == ("no-gain", "refused"), combo["reason"]
    assert combo["reason"].startswith("torch refused the artifact (")
    assert "outputs bitwise equal" in combo["reason"]
    assert combo["hot"]["artifact"]["loaded"] is False
    assert combo["hot"]["artifact"]["compiled_graphs"] >= 1  # the fallback compiled
    assert combo["max_abs_err"]["hot_vs_cold"] == 0.0


def _rehash(directory: Path) -> None:
    """Give the precompile cache the sha256 of the (edited) Python source, as a consistent
    pair from another capture would carry (run in the torch 2.15 interpreter)."""
    script = (
        "import hashlib, sys, torch\n"
        "code, cache = sys.argv[1:]\n"
        "blob = torch.load(cache, weights_only=True)\n"
        "blob['code_hash'] = hashlib.sha256(open(code, 'rb').read()).hexdigest()\n"
        "torch.save(blob, cache)\n"
    )
    code, cache = directory / "precompile-api.py", directory / "precompile-api.cache"
    subprocess.run([torch2_python(), "-c", script, str(code), str(cache)], check=True, timeout=300)


def test_precompile_api_source_edited_alone_is_refused_not_unsafe(
    newest_run: ArtifactRun, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    proc, combo = _hot(
        run_fxcache,
        newest_run,
        PRECOMPILE,
        tmp_path,
        lambda d: tamper_sine(d / "precompile-api.py"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (combo["verdict"], combo["cause"]) == ("no-gain", "refused"), combo["reason"]
    assert "PrecompileError" in combo["reason"] and "code_hash" in combo["reason"]
    assert combo["max_abs_err"]["hot_vs_cold"] == 0.0  # the fallback captured afresh


def test_a_consistently_tampered_precompile_api_pair_is_unsafe(
    newest_run: ArtifactRun, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    def fault(directory: Path) -> None:
        assert tamper_sine(directory / "precompile-api.py") >= 1
        _rehash(directory)

    proc, combo = _hot(run_fxcache, newest_run, PRECOMPILE, tmp_path, fault)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (combo["verdict"], combo["cause"]) == ("unsafe", "hot-mismatch"), combo["reason"]
    assert combo["hot"]["artifact"]["loaded"] is True
    assert combo["max_abs_err"]["hot_vs_cold"] > 0.1


def test_a_truncated_precompile_api_cache_falls_back_to_its_source_not_unsafe(
    newest_run: ArtifactRun, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    proc, combo = _hot(
        run_fxcache,
        newest_run,
        PRECOMPILE,
        tmp_path,
        lambda d: truncate(d / "precompile-api.cache"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (combo["verdict"], combo["cause"]) == ("no-gain", "refused"), combo["reason"]
    assert "Falling back to JIT from python_code" in combo["hot"]["artifact"]["refused"]
    assert combo["max_abs_err"]["hot_vs_cold"] == 0.0
