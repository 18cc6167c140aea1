"""Issue 10 §5 / issue 14: upgrade invalidation removes what an upgrade replaced, nothing else.

Real interpreters with real torch installations: the test venv (torch 2.13.0), the suite's
second torch interpreter (2.15.0, `conftest.torch2_python`: used, never modified), and a venv of
our own upgraded in place with pip.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TORCH_PYTHON, RunFxcache, torch2_python, torch_build
from tests.store_helpers import SAMPLE, Store, write_files


@pytest.fixture
def store(tmp_path: Path, run_fxcache: RunFxcache) -> Store:
    return Store(root=tmp_path / "root", run=run_fxcache, env={})


def _restore_and_save(store: Store, python: str, state: str) -> dict:
    restored = store.restore(state=state, python=python)
    write_files(restored["scope_dir"], SAMPLE)
    proc = store.save(state=state)
    assert proc.returncode == 0 and json.loads(proc.stdout)["saved"], proc.stderr
    return restored


def test_two_environments_used_alternately_keep_both_scopes(store: Store) -> None:
    torch_2_14 = torch2_python()
    a = _restore_and_save(store, TORCH_PYTHON, "a1.json")
    b = _restore_and_save(store, torch_2_14, "b1.json")
    assert a["scope_key"] != b["scope_key"] and b["invalidated"] == []
    again_a = store.restore(state="a2.json", python=TORCH_PYTHON)
    assert again_a["hit"] and again_a["invalidated"] == []
    assert store.save(state="a2.json").returncode == 0
    again_b = store.restore(state="b2.json", python=torch_2_14)
    assert again_b["hit"] and again_b["invalidated"] == []
    assert Path(a["scope_dir"]).is_dir() and Path(b["scope_dir"]).is_dir()


def _pip(venv: Path, *args: str) -> None:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_pip_upgrade_in_place_removes_the_old_scope_only(store: Store, tmp_path: Path) -> None:
    """Issue 14: a venv on torch 2.13.0 restores and saves, is upgraded with pip to 2.14.1
    (`--no-deps`: the fingerprint reads files, it never imports torch), then restores."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    _pip(venv, "torch==2.13.0")
    if torch_build().triton:  # a CUDA build: the venv gets the Triton the test's torch has
        _pip(venv, f"triton=={torch_build().triton}")
    python = str(venv / "bin" / "python")
    old = _restore_and_save(store, python, "old.json")
    scope = Path(old["scope_dir"])
    size = sum(p.stat().st_size for p in scope.rglob("*") if p.is_file())
    # A scope this venv shares with another interpreter: not this upgrade's to remove.
    keys = set()
    for name, interpreter in (("s1.json", python), ("s2.json", TORCH_PYTHON)):
        shared = store.restore("--salt", "shared", state=name, python=interpreter)
        write_files(shared["scope_dir"], {"inductor/fxgraph/s/x": b"shared" * 10})
        assert store.save(state=name).returncode == 0
        keys.add(shared["scope_key"])
    assert len(keys) == 1, keys  # one scope, two torch installations of the same build
    _pip(venv, "torch==2.14.1")
    new = store.restore(state="new.json", python=python)
    assert new["scope_key"] != old["scope_key"]
    [removed] = new["invalidated"]
    assert removed["scope"] == old["scope_key"] and removed["bytes"] == size
    # Whichever builds pip brought (`2.13.0+cpu` from a CPU index, `+cu130` by default).
    was, now = old["fingerprint"]["torch_version"], new["fingerprint"]["torch_version"]
    assert was.startswith("2.13.0") and now.startswith("2.14.1"), (was, now)
    assert removed["versions"].startswith(f"torch {was} -> {now}")
    assert f"fxcache: torch {was} -> {now}" in new["_stderr"]
    assert "removed 1 scope" in new["_stderr"]
    assert not scope.exists()
    assert Path(shared["scope_dir"]).is_dir()
