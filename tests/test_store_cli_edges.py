"""Issue 10 §6 (store parts): state files, quarantine pruning, failed removals, bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ci_fxcache.store import scopes
from ci_fxcache.store.layout import Layout
from tests.conftest import TORCH_PYTHON, RunFxcache, _clean_env
from tests.store_helpers import SAMPLE, Store, write_files


@pytest.fixture
def store(tmp_path: Path, run_fxcache: RunFxcache) -> Store:
    return Store(root=tmp_path / "root", run=run_fxcache, env={})


def _saved(store: Store, state: str = "state.json") -> dict:
    restored = store.restore(state=state)
    write_files(restored["scope_dir"], SAMPLE)
    assert store.save(state=state).returncode == 0
    return restored


def test_save_finds_its_restore_through_the_exported_state_file(
    store: Store, tmp_path: Path
) -> None:
    fxcache = f"{sys.executable} -m ci_fxcache"
    shell = (
        f'eval "$({fxcache} restore --root {store.root} --python {TORCH_PYTHON})"\n'
        'mkdir -p "$TORCHINDUCTOR_CACHE_DIR/fxgraph/a"\n'
        'echo graph > "$TORCHINDUCTOR_CACHE_DIR/fxgraph/a/b"\n'
        'echo "STATE=$FXCACHE_STATE_FILE"\n'
        f"{fxcache} save --json\n"
    )
    runs = [
        subprocess.run(
            ["bash", "-c", shell], capture_output=True, text=True, env=_clean_env({}), check=False
        )
        for _ in range(2)
    ]
    states = []
    for proc in runs:
        assert proc.returncode == 0, proc.stderr
        states.append(proc.stdout.split("STATE=")[1].splitlines()[0])
        assert '"saved": true' in proc.stdout
    assert states[0] != states[1]  # two shells never share a default state file
    alone = store.run("save")  # no --state-file, no FXCACHE_STATE_FILE, not in Actions
    assert alone.returncode == 2 and "FXCACHE_STATE_FILE" in alone.stderr
    assert "Traceback" not in alone.stderr


def _quarantine_one(store: Store) -> Path:
    first = _saved(store)
    (Path(first["scope_dir"]) / "evil.py").write_text("print('hi')")
    assert store.restore(state="q.json")["quarantined"]
    assert store.save(state="q.json").returncode == 0
    [kept] = [p for p in (store.root / ".quarantine").iterdir() if p.is_dir()]
    return kept


def test_invalidate_prunes_the_quarantine_by_the_same_policies(store: Store) -> None:
    kept = _quarantine_one(store)
    old = kept.stat().st_mtime - 30 * 86400
    os.utime(kept, (old, old))
    base = ["invalidate", "--root", str(store.root), "--json"]
    dry = json.loads(store.run(*base, "--max-age", "14d", "--dry-run").stdout)
    assert [(r["scope"], r["quarantined"]) for r in dry["rows"]] == [(kept.name, True)]
    proc = store.run(*base, "--max-age", "14d")
    assert proc.returncode == 0, proc.stderr
    assert not kept.exists() and not Path(f"{kept}.json").exists()


def test_invalidate_counts_the_quarantine_in_max_size(store: Store) -> None:
    kept = _quarantine_one(store)
    scope_bytes = sum(p.stat().st_size for p in store.root.glob("fxcache-*/**/*") if p.is_file())
    proc = store.run(
        "invalidate", "--root", str(store.root), "--json", "--max-size", str(scope_bytes + 10)
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert [r["scope"] for r in rows] == [kept.name]  # the quarantine goes before any scope
    assert not kept.exists()


def test_a_failed_removal_is_reported_as_failed(store: Store) -> None:
    first = _saved(store)
    with scopes.lock(Layout(store.root), first["scope_key"]):
        proc = store.run(
            "invalidate", "--root", str(store.root), "--max-age", "0s",
            env={"FXCACHE_LOCK_TIMEOUT": "0.3"},
        )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"^failed: ", proc.stdout, re.M) and "removal(s) FAILED" in proc.stdout
    assert "freed 0 B" in proc.stdout
    assert Path(first["scope_dir"]).is_dir()


def test_older_torch_than_must_be_a_version(store: Store) -> None:
    proc = store.run("invalidate", "--root", str(store.root), "--older-torch-than", "banana")
    assert proc.returncode == 2 and "bad torch version 'banana'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_scope_directory_that_is_a_symlink_is_refused(store: Store, tmp_path: Path) -> None:
    first = _saved(store)
    elsewhere = tmp_path / "elsewhere"
    os.rename(first["scope_dir"], elsewhere)
    Path(first["scope_dir"]).symlink_to(elsewhere)
    state = store.restore(state="after.json")
    assert state["hit"] is False
    [entry] = state["quarantined"]
    assert "symlink" in entry["reason"]
    assert not Path(state["scope_dir"]).is_symlink() and (elsewhere / "manifest.json").exists()


@pytest.mark.parametrize(
    ("name", "value"),
    [("FXCACHE_LOCK_TIMEOUT", "abc"), ("FXCACHE_LEASE_TTL", "abc"), ("FXCACHE_OVERLAY", "bogus")],
)
def test_bad_store_environment_is_one_line_and_exit_2(
    store: Store, run_fxcache: RunFxcache, name: str, value: str
) -> None:
    proc = run_fxcache(
        "restore", "--root", str(store.root), "--python", TORCH_PYTHON, env={name: value}
    )
    assert proc.returncode == 2, proc.stderr
    assert name in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
