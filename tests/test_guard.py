"""`ci_fxcache.guard`: dtype-aware comparison, and recovery from a corrupted cache entry."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, TORCH_PYTHON
from tests.faults import tamper_generated_code

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    import torch
    from ci_fxcache.guard import guarded_compile

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    def fn(x, y):
        return x.sin() @ y

    torch.manual_seed(0)
    x, y = torch.rand(64, 100), torch.rand(100, 100)
    compiled = guarded_compile(fn, x, y)
    with torch.no_grad():
        err = (compiled(x, y) - fn(x, y)).abs().max().item()
    import torch._inductor.config as c
    print(f"err={err} caches_disabled={c.force_disable_caches}")
    """
)


def test_compare_uses_dtype_tolerances() -> None:
    torch = pytest.importorskip("torch")
    from ci_fxcache.guard import compare

    x = torch.ones(8)
    assert compare(x + 1e-6, x)
    assert not compare(x + 1e-3, x)
    b = torch.ones(8, dtype=torch.bfloat16)
    assert compare(b * 1.0078125, b)  # one bfloat16 ulp at 1.0
    assert not compare(b * 1.0625, b)
    check = compare((x, x), (x,))
    assert not check and "2 output tensors vs 1" in check.detail


def _run_script(cache: Path) -> subprocess.CompletedProcess[str]:
    """SCRIPT in a fresh interpreter whose Inductor cache is `cache`."""
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    return subprocess.run(
        [TORCH_PYTHON, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.slow
def test_guard_recovers_from_a_tampered_cache(tmp_path: Path) -> None:
    cache = tmp_path / "inductor"
    clean = _run_script(cache)  # populates the cache; a correct compile raises no alarm
    assert clean.returncode == 0, clean.stderr
    assert "caches_disabled=False" in clean.stdout
    assert "disabling Inductor caches" not in clean.stderr
    assert tamper_generated_code(cache) >= 1
    tampered = _run_script(cache)
    assert tampered.returncode == 0, tampered.stderr
    assert "compiled output disagrees with the reference" in tampered.stderr
    assert "disabling Inductor caches and recompiling" in tampered.stderr
    assert "caches_disabled=True" in tampered.stdout
    err = float(tampered.stdout.split("err=")[1].split()[0])
    assert err < 1e-3  # recompiled from scratch: correct again
    shutil.rmtree(cache)


def test_a_reference_that_changes_between_runs_is_rechecked() -> None:
    import torch

    from ci_fxcache.guard import verify_compiled

    calls = [0]

    def flaky_reference(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return x * 2 + (1e-3 if calls[0] == 1 else 0.0)

    x = torch.rand(16)
    assert verify_compiled(lambda t: t * 2, flaky_reference, x)  # second reference agrees
    assert calls[0] == 2
    calls[0] = 5  # a stable reference: a real mismatch is still reported
    assert not verify_compiled(lambda t: t * 2 + 1e-3, flaky_reference, x)


def corrupt_shared_objects(cache_dir: Path) -> int:
    """Overwrite the middle of every compiled `.so` under `cache_dir` (size kept); the count."""
    count = 0
    for path in cache_dir.rglob("*.so"):
        path.chmod(0o644)
        data = bytearray(path.read_bytes())
        data[64 : 64 + 4096] = b"\xff" * len(data[64 : 64 + 4096])
        path.write_bytes(bytes(data))
        count += 1
    return count


@pytest.mark.slow
def test_guard_recovers_from_a_cached_entry_that_fails_to_load(tmp_path: Path) -> None:
    cache = tmp_path / "inductor"
    clean = _run_script(cache)
    assert clean.returncode == 0, clean.stderr
    assert corrupt_shared_objects(cache) >= 1
    broken = _run_script(cache)
    assert broken.returncode == 0, broken.stderr
    assert "compiled function failed to load or run" in broken.stderr
    assert "disabling Inductor caches and recompiling" in broken.stderr
    assert "caches_disabled=True" in broken.stdout
    err = float(broken.stdout.split("err=")[1].split()[0])
    assert err < 1e-3
